"""Dict prompts of a job, turned into token ids on the worker (the web side never tokenizes).

Two shapes (see protocol):
- a conversation `{"messages", "tools", "chat_template_kwargs", "add_generation_prompt",
  "continue_final_message"}`, rendered with a chat template, then tokenized without adding
  special tokens (the template places them, as `apply_chat_template(tokenize=True)` does);
- raw text with options `{"text", "add_special_tokens"}` (for `/tokenize`);
- token ids `{"token_ids"}`, echoed with their special tokens (for `/detokenize`).

Template precedence: the server's `--chat-template FILE` (INFERENCE_CHAT_TEMPLATE), else the
tokenizer's own, else FALLBACK_TEMPLATE (plain ChatML). Template kwargs: the server defaults
(INFERENCE_CHAT_TEMPLATE_KWARGS, then `--reasoning on|off` as `enable_thinking`), then the request's.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

import jinja2
from transformers import PreTrainedTokenizerBase

from workers.engine.config import TemplateSettings
from workers.engine.errors import JobError
from protocol import Conversation, TextPrompt, TokenIdsPrompt

FALLBACK_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}{{- part.text }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class RenderedPrompt:
    ids: list[int]
    text: str  # the rendered text: a parsed answer's parser starts where it leaves off (workers/engine/output/parsing)
    media_inputs: dict | None = None  # the processor's tensors beside the ids (pixel_values, …) for media prompts


@lru_cache(maxsize=8)
def _read_template(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def server_template(templates: TemplateSettings) -> str | None:
    """The `--chat-template` file's text, if the server was given one."""
    path = templates.path
    if not path:
        return None
    try:
        return _read_template(os.path.expanduser(path))
    except OSError as exc:
        raise JobError(500, f"The server's chat template file could not be read: {exc}", None,
                       "chat_template_unreadable") from exc


def server_template_kwargs(templates: TemplateSettings) -> dict:
    """Server-wide template kwargs: INFERENCE_CHAT_TEMPLATE_KWARGS, then the reasoning switch."""
    kwargs: dict = {}
    raw = templates.kwargs_json
    if raw:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            kwargs.update(loaded)
    reasoning = (templates.reasoning or "auto").lower()
    if reasoning in ("on", "off"):
        kwargs["enable_thinking"] = reasoning == "on"
    return kwargs


def render_conversation(tokenizer: PreTrainedTokenizerBase, conversation: Conversation,
                        templates: TemplateSettings, default_template: str | None = None) -> RenderedPrompt:
    """Render a conversation with the chosen template and tokenize it; bad input is a JobError 400.

    `default_template` stands in where the tokenizer has none (a processor's own template).
    """
    template = server_template(templates)
    if template is None and not getattr(tokenizer, "chat_template", None):
        template = default_template or FALLBACK_TEMPLATE
    kwargs = {**server_template_kwargs(templates), **(conversation.get("chat_template_kwargs") or {})}
    if conversation.get("documents"):
        kwargs["documents"] = conversation["documents"]
    try:
        text = tokenizer.apply_chat_template(
            conversation["messages"],
            tools=conversation.get("tools") or None,
            chat_template=template,
            add_generation_prompt=bool(conversation.get("add_generation_prompt", True)),
            continue_final_message=bool(conversation.get("continue_final_message", False)),
            tokenize=False,
            **kwargs,
        )
    except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise JobError(400, f"The chat template could not render these messages: {exc}", "messages",
                       "chat_template_error") from exc
    if not isinstance(text, str):
        raise JobError(400, "The chat template did not produce text.", "messages", "chat_template_error")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise JobError(400, "The rendered conversation is empty.", "messages", "empty_prompt")
    return RenderedPrompt(ids, text)


def render_fitting(tokenizer: PreTrainedTokenizerBase, conversation: Conversation, templates: TemplateSettings,
                   budget: int) -> RenderedPrompt:
    """Responses' truncation "auto": drop the oldest turns (never a leading system message, never the
    last turn) until the rendered prompt has at most `budget` tokens; what still does not fit is
    left for the context check to refuse."""
    messages = list(conversation["messages"])
    rendered = render_conversation(tokenizer, conversation, templates)
    first = 1 if messages and messages[0]["role"] == "system" else 0
    while len(rendered.ids) > budget and len(messages) - first > 1:
        del messages[first]
        while len(messages) - first > 1 and messages[first]["role"] == "tool":
            del messages[first]  # a tool result without its call would confuse the template
        rendered = render_conversation(tokenizer, {**conversation, "messages": messages}, templates)
    return rendered


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Conversation | TextPrompt | TokenIdsPrompt,
                  templates: TemplateSettings) -> RenderedPrompt:
    """A dict prompt of any of its shapes (a conversation, text with tokenizer options, token ids)."""
    if "messages" in prompt:
        return render_conversation(tokenizer, prompt, templates)
    if "token_ids" in prompt:  # ids echoed back with their special tokens (for /detokenize)
        ids = list(prompt["token_ids"])
        if any(not isinstance(t, int) or not 0 <= t < len(tokenizer) for t in ids):
            raise JobError(400, f"Token ids must be in [0, {len(tokenizer)}).", "tokens", "invalid_token_id")
        return RenderedPrompt(ids, "")
    text = prompt.get("text")
    if not isinstance(text, str):
        raise JobError(400, "A prompt object needs `messages` or `text`.", "prompt", "invalid_prompt")
    ids = list(tokenizer(text, add_special_tokens=bool(prompt.get("add_special_tokens", True)))["input_ids"])
    return RenderedPrompt(ids, text)
