"""A token as logprobs show it: its text, or OpenAI's `bytes:\\xNN` form when it is part of a character.

Byte-level tokenizers split multi-byte characters (é, €, emoji) across tokens; decoding one such
token alone gives "\\ufffd", and the tokens would no longer join to the text. For those the raw
bytes are written out (`bytes:\\xe2\\x82`), as OpenAI does, so a client can rebuild the text.
"""
from __future__ import annotations

import re
from functools import lru_cache

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a byte-level BPE writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


class TokenText:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def __call__(self, token_id: int) -> str:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        if REPLACEMENT_CHAR not in text:
            return text
        raw = self.raw_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)

    def raw_bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        decoder = byte_level_decoder()
        if all(char in decoder for char in piece):
            return bytes(decoder[char] for char in piece)
        fallback = BYTE_FALLBACK.fullmatch(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")


class TokenIdText:
    """vLLM's return_tokens_as_token_ids: every logprobs token is named `token_id:<id>`."""

    as_ids = True

    def __call__(self, token_id: int) -> str:
        return f"token_id:{token_id}"


def settled_length(text: str) -> int:
    """Characters of decoded text before a trailing unfinished character ("\\ufffd"): where the next token starts."""
    return len(text.rstrip(REPLACEMENT_CHAR))
