"""Which tool-call and reasoning format a model writes: the parser names (vLLM's) and how one is chosen.

Plain Python, read by both sides: the catalog shows what a model's files say (catalog/hf_cache.py),
the worker parses with it (workers/engine/output/parsing). The choice, first match wins:

1. the catalog's override for the model (admin or config file: `tool_parser` / `reasoning_parser`);
2. the tokenizer's own `response_template` (transformers' parser: `parse_response`), shown as
   "response_template";
3. the family: the markers its chat template writes and its tokenizer's added tokens (FAMILY_RULES,
   in order), else its `model_type` (an architecture is shared by families: Kimi K2 is DeepSeek V3's);
4. Hermes tool calls and `<think>` reasoning (what the tiny test models and Qwen 2.5/3 write).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RESPONSE_TEMPLATE = "response_template"
# vLLM's names (`--tool-call-parser`), what each reads; aliases map to the one that does the work.
TOOL_PARSERS: dict[str, str] = {
    "hermes": "<tool_call>{json}</tool_call> (Hermes, Qwen 2.5, Qwen 3)",
    "qwen3_coder": "<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call> (Qwen3-Coder, Qwen 3.5)",
    "llama3_json": '{"name": …, "parameters": {…}}, alone or after <|python_tag|> (Llama 3.1-3.3)',
    "pythonic": "[f(a=1), g(b='x')] (Llama 4, Granite 4, Llama 3.2 pythonic, others)",
    "llama4_pythonic": "pythonic, also inside <|python_start|>…<|python_end|> (Llama 4)",
    "mistral": '[TOOL_CALLS][{"name", "arguments"}] or [TOOL_CALLS]name[ARGS]{…} (Mistral, Mixtral, Devstral)',
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json …``` (DeepSeek V3, R1)",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…} (DeepSeek V3.1, V3.2)",
    "granite": "<|tool_call|>[{…}] (Granite 3.x)",
    "gemma4": '<|tool_call>call:NAME{key:<|"|>v<|"|>}<tool_call|> (Gemma 4)',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…} (Kimi K2)",
    "glm45": "<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call> (GLM-4.5, 4.6)",
    "openai": "Harmony: <|channel|>commentary to=functions.NAME<|message|>{…}<|call|> (gpt-oss)",
}
TOOL_PARSER_ALIASES = {"qwen3_xml": "qwen3_coder", "llama4_json": "llama3_json", "qwen": "hermes"}
REASONING_PARSERS: dict[str, str] = {
    "qwen3": "<think>…</think> (Qwen 3, QwQ, Kimi, most others)",
    "deepseek_r1": "<think>…</think>, the answer's start counted as reasoning until </think> (DeepSeek R1)",
    "glm45": "<think>…</think> (GLM-4.5)",
    "mistral": "[THINK]…[/THINK] (Magistral)",
    "granite": "Here is my thought process: … Here is my response: (Granite 3.2)",
    "gemma4": "<|channel>thought…<channel|> (Gemma 4)",
    "openai_gptoss": "Harmony's analysis channel (gpt-oss)",
}
REASONING_PARSER_ALIASES = {"deepseek_v3": "deepseek_r1", "kimi_k2": "qwen3", "gpt_oss": "openai_gptoss"}
DEFAULT_TOOL_PARSER, DEFAULT_REASONING_PARSER = "hermes", "qwen3"


@dataclass(frozen=True)
class ParserChoice:
    tool_parser: str
    reasoning_parser: str | None
    source: str  # "override", "response_template", "model_type", "chat_template" or "default"

    def as_dict(self) -> dict:
        return {"tool_parser": self.tool_parser, "reasoning_parser": self.reasoning_parser, "source": self.source}


# (model types, markers of which the chat template or added tokens hold any, tool parser, reasoning parser);
# a marker that is a tuple needs all of its strings.
Marker = str | tuple[str, ...]
FAMILY_RULES: tuple[tuple[tuple[str, ...], tuple[Marker, ...], str, str | None], ...] = (
    (("gpt_oss",), ("<|channel|>",), "openai", "openai_gptoss"),
    (("gemma4", "gemma4_text"), ("<|tool_call>",), "gemma4", "gemma4"),
    (("kimi_k2",), ("<|tool_calls_section_begin|>",), "kimi_k2", "qwen3"),
    ((), (("<｜tool▁calls▁begin｜>", "```json"),), "deepseek_v3", "deepseek_r1"),
    (("deepseek_v3", "deepseek_v32"), ("<｜tool▁calls▁begin｜>",), "deepseek_v31", "deepseek_r1"),
    (("glm4_moe",), ("<arg_key>",), "glm45", "glm45"),
    (("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"), ("<function=",), "qwen3_coder", "qwen3"),
    (("mistral", "mistral3", "mixtral", "ministral"), ("[TOOL_CALLS]",), "mistral", None),
    (("llama4", "llama4_text"), ("<|python_start|>",), "llama4_pythonic", None),
    ((), ("<|tool_call|>",), "granite", "granite"),
    ((), ("<|python_tag|>",), "llama3_json", None),
    (("granitemoehybrid",), (), "pythonic", None),
    ((), ("<tool_call>",), "hermes", "qwen3"),
)


def canonical(name: str | None, kind: str) -> str | None:
    """A parser name as the registry knows it (an alias resolved); ValueError for an unknown one."""
    if not name:
        return None
    known, aliases = (TOOL_PARSERS, TOOL_PARSER_ALIASES) if kind == "tool" else (REASONING_PARSERS, REASONING_PARSER_ALIASES)
    name = aliases.get(name, name)
    if kind == "reasoning" and name == "none":
        return "none"
    if name not in known:
        raise ValueError(f"unknown {kind} parser {name!r}; one of {', '.join(sorted(known))}"
                         + (", none" if kind == "reasoning" else ""))
    return name


def detect_parsers(model_type: str, chat_template: str, special_tokens: Iterable[str],
                   has_response_template: bool = False) -> ParserChoice:
    """The parsers a model's files point to (no override): see the module docstring."""
    if has_response_template:
        return ParserChoice(RESPONSE_TEMPLATE, RESPONSE_TEMPLATE, RESPONSE_TEMPLATE)
    special_tokens = list(special_tokens)
    haystack = (chat_template or "") + "\n" + "\n".join(special_tokens)
    for _, markers, tool, reasoning in FAMILY_RULES:
        if any(all(part in haystack for part in ((m,) if isinstance(m, str) else m)) for m in markers):
            return ParserChoice(tool, _reasoning_for(reasoning, chat_template, special_tokens), "chat_template")
    model_type = (model_type or "").lower()
    for types, _, tool, reasoning in FAMILY_RULES:
        if model_type in types:
            return ParserChoice(tool, _reasoning_for(reasoning, chat_template, special_tokens), "model_type")
    return ParserChoice(DEFAULT_TOOL_PARSER, DEFAULT_REASONING_PARSER, "default")


def _reasoning_for(family: str | None, chat_template: str, special_tokens: Iterable[str]) -> str | None:
    """The family's reasoning parser; one that has none still gets `<think>` or `[THINK]` when its files have them."""
    if family:
        return family
    tokens = set(special_tokens)
    if "[THINK]" in tokens or "[THINK]" in (chat_template or ""):
        return "mistral"
    return "qwen3" if "<think>" in tokens or "<think>" in (chat_template or "") else None


def choose_parsers(detected: ParserChoice, tool_override: str = "", reasoning_override: str = "") -> ParserChoice:
    """The detected choice with the catalog's overrides over it (either may be blank: auto)."""
    if not tool_override and not reasoning_override:
        return detected
    tool = canonical(tool_override, "tool") or detected.tool_parser
    reasoning = canonical(reasoning_override, "reasoning") if reasoning_override else detected.reasoning_parser
    if detected.tool_parser == RESPONSE_TEMPLATE and reasoning_override and not tool_override:
        tool = DEFAULT_TOOL_PARSER  # the template parses both or neither
    if tool == RESPONSE_TEMPLATE and reasoning != RESPONSE_TEMPLATE:
        tool = DEFAULT_TOOL_PARSER
    return ParserChoice(tool, None if reasoning == "none" else reasoning, "override")
