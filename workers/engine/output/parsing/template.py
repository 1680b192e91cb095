"""A tokenizer's own `response_template`, read by transformers' own streaming parser (`ResponseParser`,
what `tokenizer.parse_response` and `get_response_parser` use), its region events turned into Parts.

The template names the message's fields: `content`, `reasoning_content` (or `thinking`) stream as they
come; a `tool_calls` region goes out when it closes ({"type": "function", "function": {name, arguments}}).
Where the parser refuses a region (a call that is not JSON), that region's text and the rest of the
answer are content.
"""
from __future__ import annotations

import json
import logging

from protocol import Part

from . import parts

logger = logging.getLogger(__name__)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateParser:
    def __init__(self, template: dict, prompt_text: str, tools: list[dict] | None, parse_tools: bool,
                 calls: parts.Calls | None = None) -> None:
        from transformers.utils.chat_parsing import ResponseParser

        self.parse_tools = parse_tools
        self.calls = calls or parts.Calls()
        self.region_text = ""  # the open structured region's raw text, for when it must become content
        self.broken = False
        self.strip = True  # a text field's leading whitespace is dropped...
        self.held = ""  # ...and its trailing whitespace held until more text follows (transformers strips both)
        try:
            self.parser = ResponseParser(template, prefix=prompt_text, tools=tools or None)
        except Exception as exc:  # a template transformers cannot load: the answer is content
            logger.warning("the tokenizer's response_template cannot be used (%s); the answer is content", exc)
            self.broken = True

    def prime(self, prompt_text: str) -> None:
        """The prompt was given as the parser's prefix already."""

    def feed(self, text: str, token_ids: list[int] | None = None) -> list[Part]:
        if self.broken:
            return [parts.content(text)] if text else []
        try:
            return self._parts(self.parser.feed(text))
        except Exception as exc:
            return self._give_up(exc, text)

    def finish(self) -> list[Part]:
        if self.broken:
            return []
        try:
            _, events = self.parser.finalize()
        except Exception as exc:
            return self._give_up(exc, "")
        return self._parts(events)

    def _give_up(self, exc: Exception, text: str) -> list[Part]:
        logger.info("the response_template parser refused the answer (%s); the rest is content", exc)
        self.broken = True
        raw, self.region_text = self.region_text + text, ""
        return [parts.content(raw)] if raw else []

    def _parts(self, events: list[dict]) -> list[Part]:
        out: list[Part] = []
        for event in events:
            field, kind = event["field"], event["type"]
            if kind == "region_open":
                self.region_text = ""
            elif kind == "region_chunk":
                if event.get("dirty"):
                    self.region_text += event["text"]
                elif field in REASONING_FIELDS:
                    self._text(parts.reasoning(event["text"]), out)
                elif field == "content":
                    self._text(parts.content(event["text"]), out)
            elif kind == "region_close":
                self.held = ""
                if field == "tool_calls":
                    self._calls(event["value"], out)
                elif event.get("value") is not None and self.region_text and field not in REASONING_FIELDS:
                    self._text(parts.content(self.region_text), out)  # a structured field of no OpenAI place
                self.region_text, self.strip = "", True
        return out

    def _text(self, part: Part, out: list[Part]) -> None:
        text = self.held + part["text"]
        if self.strip:
            text = text.lstrip()
        kept = text.rstrip()
        self.held = text[len(kept):]
        if kept:
            self.strip = False
            parts.append(out, {**part, "text": kept})

    def _calls(self, value, out: list[Part]) -> None:
        values = value if isinstance(value, list) else [value]
        found = []
        for item in values:
            function = item.get("function") if isinstance(item, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                found = None
                break
            arguments = function.get("arguments", {})
            found.append((function["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)))
        if not self.parse_tools or not found:
            self._text(parts.content(self.region_text), out)
            return
        for name, arguments in found:
            self.calls.emit(name, arguments, out)
