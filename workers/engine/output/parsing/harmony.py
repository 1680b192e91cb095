"""gpt-oss's Harmony format: an answer is messages on channels.

`<|channel|>analysis<|message|>…<|end|>` is reasoning, `<|channel|>final<|message|>…` the content, and
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>` a tool call (its
name goes out as soon as the header is read, its arguments as they come). A commentary message to no
one (a preamble) is content.

Where the `openai-harmony` library's encoding loads and the model's tokenizer is its o200k_harmony
(real gpt-oss), its `StreamableParser` reads the token ids (`HarmonyTokenParser`). The encoding's
vocabulary file is written from the model's own tokenizer (no download; the library checks its hash,
so only the real o200k vocabulary passes). Elsewhere (a tiny test model, a tokenizer of another
vocabulary, the library refusing) `HarmonyTextParser` reads the same markers in the text.
"""
from __future__ import annotations

import base64
import logging
import os
import re
import tempfile
import threading
from pathlib import Path

from protocol import Part

from . import parts
from .markers import SteppedParser, earliest, partial_suffix

logger = logging.getLogger(__name__)

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
ENDS = (END, CALL, RETURN)
MARKERS = (START, CHANNEL, MESSAGE, END, CALL, RETURN)
CHANNEL_NAME = re.compile(r"<\|channel\|>\s*(\w+)")
RECIPIENT = re.compile(r"to=([^\s<]+)")
HARMONY_IDS = {"<|channel|>": 200005, "<|start|>": 200006, "<|message|>": 200008, "<|call|>": 200012}


class _Router:
    """Where a message's body goes, by its channel and recipient (shared by the text and token parsers)."""

    def __init__(self, parse_tools: bool, calls: parts.Calls) -> None:
        self.parse_tools = parse_tools
        self.calls = calls
        self.kind = "content"
        self.call_index: int | None = None

    def open(self, channel: str, recipient: str, out: list[Part]) -> None:
        self.call_index = None
        if recipient.startswith("functions.") and self.parse_tools:
            self.call_index = self.calls.open(recipient[len("functions."):], out)
            self.kind = "dropped" if self.call_index is None else "arguments"
        elif channel == "analysis":
            self.kind = "reasoning"
        else:  # final, a commentary preamble, a built-in tool's input: text the client sees
            self.kind = "content"

    def body(self, text: str, out: list[Part]) -> None:
        if not text or self.kind == "dropped":
            return
        if self.kind == "arguments":
            out.append(parts.arguments(self.call_index, text))
        else:
            parts.append(out, parts.content(text) if self.kind == "content" else parts.reasoning(text))


class HarmonyTextParser(SteppedParser):
    """Harmony read from the decoded text (its special tokens kept)."""

    def __init__(self, parse_tools: bool, calls: parts.Calls | None = None) -> None:
        self.router = _Router(parse_tools, calls or parts.Calls())
        self.state = "header"  # the prompt ends with "<|start|>assistant": the answer starts in a header
        self.buffer = ""
        self.strip = False

    def prime(self, prompt_text: str) -> None:
        """Continue a prefilled assistant message: its text since the prompt's last <|start|>, silently."""
        start = prompt_text.rfind(START)
        if start >= 0:
            calls = self.router.calls.count
            self.feed(prompt_text[start + len(START):])
            self.router.calls.count = calls

    def _flush(self, out: list[Part]) -> None:
        if self.state == "body":
            self._body(self.buffer.rstrip(), out)
        elif self.buffer.strip():  # a header never finished, text between messages: what it wrote is content
            parts.append(out, parts.content(self.buffer.strip()))

    def _body(self, text: str, out: list[Part]) -> None:
        if self.strip:
            text = text.lstrip()
        if text:
            self.strip = False
            self.router.body(text, out)

    def _step(self, out: list[Part], final: bool) -> bool:
        if self.state == "header":
            index = self.buffer.find(MESSAGE)
            if index < 0:
                return False
            header = self.buffer[:index]
            channel = CHANNEL_NAME.search(header)
            recipient = RECIPIENT.search(header)
            self.router.open(channel.group(1) if channel else "final", recipient.group(1) if recipient else "", out)
            self.buffer, self.state, self.strip = self.buffer[index + len(MESSAGE):], "body", True
            return True
        if self.state == "between":
            index = self.buffer.find(START)
            if index < 0:
                if self.buffer.strip() and not START.startswith(self.buffer.strip()[:len(START)]):
                    parts.append(out, parts.content(self.buffer.strip()))  # stray text between messages
                    self.buffer = ""
                return False
            self.buffer, self.state = self.buffer[index + len(START):], "header"
            return True
        found = earliest(self.buffer, (*ENDS, START))
        if found is not None:
            index, marker = found
            self._body(self.buffer[:index].rstrip(), out)
            self.buffer = self.buffer[index + len(marker):]
            self.state = "header" if marker == START else "between"
            return True
        if final:
            return False
        safe = len(self.buffer) - partial_suffix(self.buffer, (*ENDS, START))
        safe = len(self.buffer[:safe].rstrip())  # trailing whitespace may precede the end marker
        self._body(self.buffer[:safe], out)
        self.buffer = self.buffer[safe:]
        return False


class HarmonyTokenParser:
    """Harmony read by openai-harmony's StreamableParser from the token ids; the text parser takes over
    for the rest of the answer should the library refuse a token."""

    def __init__(self, encoding, parse_tools: bool, calls: parts.Calls | None = None) -> None:
        from openai_harmony import Role, StreamableParser

        self.parser = StreamableParser(encoding, role=Role.ASSISTANT)
        self.router = _Router(parse_tools, calls or parts.Calls())
        self.header: tuple | None = None
        self.fallback: HarmonyTextParser | None = None

    def prime(self, prompt_text: str) -> None:
        """The prompt ends with `<|start|>assistant` (the template's generation prompt): nothing to continue."""

    def feed(self, text: str, token_ids: list[int] | None = None) -> list[Part]:
        if self.fallback is not None:
            return self.fallback.feed(text)
        out: list[Part] = []
        for token in token_ids or ():
            try:
                self.parser.process(token)
            except Exception as exc:  # the library refused: read the rest as text
                logger.warning("openai-harmony could not parse token %d (%s); reading the rest as text", token, exc)
                self.fallback = HarmonyTextParser(self.router.parse_tools, self.router.calls)
                self.fallback.state, self.fallback.router = "body", self.router
                return out + self.fallback.feed(text)
            self._route(out)
        return out

    def _route(self, out: list[Part]) -> None:
        """A message's first content opens it (its channel and recipient read then), the rest follows it."""
        delta = self.parser.last_content_delta
        if not delta:
            return
        header = (len(self.parser.messages), self.parser.current_channel, self.parser.current_recipient)
        if header != self.header:
            self.header = header
            self.router.open(header[1] or "final", header[2] or "", out)
        self.router.body(delta, out)

    def finish(self) -> list[Part]:
        if self.fallback is not None:
            return self.fallback.finish()
        try:
            self.parser.process_eos()
        except Exception:
            pass
        return []


_encoding_lock = threading.Lock()
_encoding: list = []  # [encoding or None], once tried


def speaks_harmony_ids(tokenizer) -> bool:
    """Whether the tokenizer's Harmony markers have o200k_harmony's ids (real gpt-oss)."""
    try:
        return all(tokenizer.convert_tokens_to_ids(token) == token_id for token, token_id in HARMONY_IDS.items())
    except Exception:
        return False


def harmony_encoding(tokenizer):
    """openai-harmony's gpt-oss encoding, its vocabulary written from `tokenizer` where none is set up;
    None where the library is missing or refuses (it checks the vocabulary's hash)."""
    if not speaks_harmony_ids(tokenizer):
        return None
    with _encoding_lock:
        if _encoding:
            return _encoding[0]
        try:
            from openai_harmony import HarmonyEncodingName, load_harmony_encoding

            if not os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(write_vocabulary(tokenizer))
            _encoding.append(load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS))
        except Exception as exc:
            logger.warning("openai-harmony's encoding did not load (%s); gpt-oss output is read as text", exc)
            _encoding.append(None)
        return _encoding[0]


def write_vocabulary(tokenizer, folder: Path | None = None) -> Path:
    """`o200k_base.tiktoken` (base64 token bytes and rank per line) from a byte-level BPE tokenizer's
    ordinary tokens, in a folder for TIKTOKEN_ENCODINGS_BASE; returns the folder."""
    from workers.engine.output.token_text import byte_level_decoder

    folder = folder or Path(tempfile.gettempdir()) / "inference-harmony-vocab"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "o200k_base.tiktoken"
    if target.exists():
        return folder
    decoder = byte_level_decoder()
    special = set(getattr(tokenizer, "all_special_ids", ()) or ()) | set(tokenizer.get_added_vocab().values())
    lines = []
    for piece, rank in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        if rank in special or not all(char in decoder for char in piece):
            continue
        lines.append(f"{base64.b64encode(bytes(decoder[c] for c in piece)).decode()} {rank}\n")
    partial = target.with_suffix(f".{os.getpid()}.partial")
    partial.write_text("".join(lines))
    os.replace(partial, target)
    return folder
