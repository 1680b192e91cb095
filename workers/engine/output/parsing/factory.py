"""A loaded model's output format (which parsers, which special tokens they read) and a parser per choice."""
from __future__ import annotations

from dataclasses import dataclass

from protocol.output_formats import RESPONSE_TEMPLATE, ParserChoice, choose_parsers, detect_parsers

from . import parts
from .families import REASONING_FORMATS, TOOL_FORMATS
from .harmony import MARKERS as HARMONY_MARKERS, HarmonyTextParser, HarmonyTokenParser, harmony_encoding
from .regions import RegionParser
from .template import TemplateParser

# Markers inside a call region (besides the regions' own): special tokens a parser must see.
INNER_MARKERS: dict[str, tuple[str, ...]] = {
    "mistral": ("[ARGS]", "[CALL_ID]", "[TOOL_CALLS]"),
    "deepseek_v3": ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"),
    "deepseek_v31": ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"),
    "kimi_k2": ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
    "gemma4": ('<|"|>',),
    "glm45": ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "openai": (*HARMONY_MARKERS, "<|constrain|>"),
}


@dataclass(frozen=True)
class OutputFormat:
    """How a model's answers are parsed: the parsers, and the special tokens they read."""

    choice: ParserChoice
    detected: ParserChoice
    response_template: dict | None = None
    keep_special_tokens: bool = False  # decode parsed answers with special tokens: markers are special
    hidden_ids: frozenset[int] = frozenset()  # the other special tokens, left out of the decoded text
    harmony: object = None  # openai-harmony's encoding (real gpt-oss), else None
    mistral_named: bool = False  # the tokenizer has [ARGS]: calls are written name[ARGS]{…}

    @property
    def tool_parser(self) -> str:
        return self.choice.tool_parser

    @property
    def harmony_format(self) -> bool:
        return self.choice.tool_parser == "openai" or self.choice.reasoning_parser == "openai_gptoss"

    def markers(self) -> tuple[str, ...]:
        """Every marker the chosen parsers read."""
        found: list[str] = list(INNER_MARKERS.get(self.choice.tool_parser, ()))
        if self.harmony_format:
            found += INNER_MARKERS["openai"]
        for fmt in (TOOL_FORMATS.get(self.choice.tool_parser), REASONING_FORMATS.get(self.choice.reasoning_parser or "")):
            for region in (fmt.regions if fmt else ()):
                found += [region.open, *((region.close,) if region.close else ())]
        return tuple(found)


def special_token_texts(tokenizer) -> set[str]:
    """The texts of the tokens `decode(skip_special_tokens=True)` leaves out."""
    texts = {str(token) for token in getattr(tokenizer, "all_special_tokens", ()) or ()}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts |= {token.content for token in decoder.values() if getattr(token, "special", False)}
    return texts


def model_type_of(model) -> str:
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", None) if config is not None else None
    return str(getattr(config, "model_type", "") or getattr(text_config, "model_type", "") or "")


def output_format(tokenizer, model_type: str, tool_override: str = "", reasoning_override: str = "") -> OutputFormat:
    """The parsers for a model (the catalog's overrides over what its files say) and what they need."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(str(t) for t in template.values())
    response_template = getattr(tokenizer, "response_template", None)
    specials = special_token_texts(tokenizer)
    added = set(tokenizer.get_added_vocab()) if hasattr(tokenizer, "get_added_vocab") else set()
    detected = detect_parsers(model_type, template, specials | added, isinstance(response_template, dict))
    choice = choose_parsers(detected, tool_override, reasoning_override)
    base = OutputFormat(choice, detected, response_template if choice.tool_parser == RESPONSE_TEMPLATE else None,
                        mistral_named="[ARGS]" in added)
    if base.response_template is not None:  # its patterns may name any special token
        return OutputFormat(choice, detected, base.response_template, keep_special_tokens=bool(specials))
    markers = base.markers()
    needed = {text for text in specials if any(text in marker for marker in markers)}
    hidden = {tokenizer.convert_tokens_to_ids(text) for text in specials - needed} if needed else set()
    encoding = harmony_encoding(tokenizer) if base.harmony_format else None
    return OutputFormat(choice, detected, None, keep_special_tokens=bool(needed),
                        hidden_ids=frozenset(i for i in hidden if isinstance(i, int)),
                        harmony=encoding, mistral_named=base.mistral_named)


def tool_schemas(tools: list[dict] | None) -> dict:
    """{name: parameters schema} of a conversation's tools."""
    schemas = {}
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            schemas[function["name"]] = function.get("parameters") or {}
    return schemas


def make_parser(fmt: OutputFormat, prompt_text: str, tools: list[dict] | None, parse_tools: bool,
                max_calls: int | None = None):
    """A parser for one choice, primed with its prompt; `feed(text, token_ids)` and `finish()` give Parts."""
    calls = parts.Calls(max_calls)
    if fmt.response_template is not None:
        return TemplateParser(fmt.response_template, prompt_text, tools, parse_tools, calls)
    if fmt.harmony_format:
        parser = (HarmonyTokenParser(fmt.harmony, parse_tools, calls) if fmt.harmony is not None
                  else HarmonyTextParser(parse_tools, calls))
    else:
        parser = RegionParser(REASONING_FORMATS.get(fmt.choice.reasoning_parser or ""),
                              TOOL_FORMATS.get(fmt.choice.tool_parser), parse_tools, tool_schemas(tools), calls)
    parser.prime(prompt_text)
    return parser


def open_reasoning(fmt: OutputFormat, prompt_text: str) -> str | None:
    """The marker that closes reasoning the prompt leaves open (a thinking template's `<think>`), or None."""
    if fmt is None or fmt.response_template is not None or fmt.harmony_format:
        return None
    parser = make_parser(fmt, prompt_text, None, False)
    region = getattr(parser, "region", None)
    return region.close if region is not None and region.kind == "reasoning" else None
