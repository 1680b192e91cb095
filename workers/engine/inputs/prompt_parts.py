"""Where a conversation's prompt tokens go: the tools, the system prompt and the messages apart (issue 49).

A context error that said only "the messages alone are 13,605 tokens" misled a client whose ~40 messages were
small and whose 36 tools (Open WebUI's) were 13.6k: the template renders tools and system prompt into the same
prompt. Computed only when a prompt does not fit, by rendering the conversation again without the tools, then
without the system messages too; the differences are each part's share."""
from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from workers.engine.config import TemplateSettings
from workers.engine.errors import JobError
from workers.engine.inputs.chat_templates import render_prompt

SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class PromptParts:
    total: int
    tools: int
    tool_count: int
    system: int
    messages: int

    def described(self) -> str:
        """The split in words, biggest part first."""
        parts = [(self.messages, f"the messages {self.messages:,}"),
                 (self.system, f"the system prompt {self.system:,}"),
                 (self.tools, f"the {self.tool_count} tools {self.tools:,}")]
        said = ", ".join(text for count, text in sorted(parts, key=lambda part: -part[0]) if count > 0)
        return f"{self.total:,} tokens ({said}, with the template's own tokens)"


def conversation_parts(tokenizer: PreTrainedTokenizerBase, prompt: object, total: int,
                       templates: TemplateSettings) -> PromptParts | None:
    """The split of a text conversation's `total` prompt tokens; None for other prompts (text, token ids,
    media) or when a part cannot be rendered alone (a template that needs a user turn, say)."""
    if not isinstance(prompt, dict) or not isinstance(prompt.get("messages"), list):
        return None
    tools = prompt.get("tools") or []
    messages = prompt["messages"]
    others = [m for m in messages if not (isinstance(m, dict) and m.get("role") in SYSTEM_ROLES)]
    try:
        without_tools = len(render_prompt(tokenizer, {**prompt, "tools": None}, templates).ids) if tools else total
        alone = (len(render_prompt(tokenizer, {**prompt, "tools": None, "messages": others}, templates).ids)
                 if others and len(others) < len(messages) else without_tools)
    except JobError:
        return None
    return PromptParts(total=total, tools=max(total - without_tools, 0), tool_count=len(tools),
                       system=max(without_tools - alone, 0), messages=alone)
