"""gpt-oss's Harmony through openai-harmony itself, offline: the library's encoding wants the real o200k_base
vocabulary (it checks the file's hash), which LiteLLM's wheel ships (a test-only dependency).

- the worker's path for a real gpt-oss tokenizer: `harmony_encoding` writes the vocabulary file from the
  tokenizer's own vocabulary (no download) and the library accepts it, byte for byte the real file;
- `HarmonyTokenParser` reads real token ids as the library's StreamableParser does, to the same parts as
  the text parser reads from the same answer, a call's arguments streaming in fragments;
- the tiny gpt-oss template (workers/tiny/chat_formats.py) renders a tool round trip exactly as the
  library renders those messages.
"""
from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import pytest

from workers.engine.output.parsing import harmony
from workers.engine.output.parsing.harmony import HarmonyTextParser, HarmonyTokenParser

from .parse_whole import joined

# o200k_base.tiktoken as LiteLLM ships it for offline use (named as tiktoken's cache names that file)
LITELLM_O200K = ("litellm_core_utils", "tokenizers", "fb374d419588a4632f3f557e76b4b70aebbca790")
SPECIAL = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
           200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}


@pytest.fixture(scope="module")
def o200k_folder(tmp_path_factory) -> Path:
    """A folder for TIKTOKEN_ENCODINGS_BASE holding the real o200k_base.tiktoken."""
    shipped = Path(importlib.util.find_spec("litellm").submodule_search_locations[0]).joinpath(*LITELLM_O200K)
    folder = tmp_path_factory.mktemp("o200k")
    (folder / "o200k_base.tiktoken").write_bytes(shipped.read_bytes())
    return folder


@pytest.fixture(scope="module")
def encoding(o200k_folder):
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(o200k_folder))
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def gpt_oss_tokenizer(vocabulary: Path):
    """A fast tokenizer holding gpt-oss's vocabulary as its tokenizer.json does (byte-level pieces, the
    Harmony markers at o200k_harmony's ids); its merges are left out, nothing here encodes with it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from workers.engine.output.token_text import byte_level_decoder

    char_of = {byte: char for char, byte in byte_level_decoder().items()}
    vocab = {}
    for line in vocabulary.read_text().splitlines():
        token, rank = line.split()
        vocab["".join(char_of[byte] for byte in base64.b64decode(token))] = int(rank)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[])))
    tokenizer.add_special_tokens({"additional_special_tokens": [SPECIAL.get(i, f"<|reserved_{i}|>")
                                                                for i in range(199998, 200019)]})
    return tokenizer


def test_the_worker_writes_the_vocabulary_from_a_gpt_oss_tokenizer_and_the_library_accepts_it(
        o200k_folder, tmp_path, monkeypatch):
    tokenizer = gpt_oss_tokenizer(o200k_folder / "o200k_base.tiktoken")
    assert harmony.speaks_harmony_ids(tokenizer)
    monkeypatch.setattr(harmony, "_encoding", [])  # not tried yet in this process
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "")  # none set up: the worker writes one
    encoding = harmony.harmony_encoding(tokenizer)
    assert encoding is not None
    written = Path(harmony.os.environ["TIKTOKEN_ENCODINGS_BASE"]) / "o200k_base.tiktoken"
    assert written.read_bytes() == (o200k_folder / "o200k_base.tiktoken").read_bytes()
    assert encoding.encode("<|channel|>analysis<|message|>", allowed_special="all")[::2] == [200005, 200008]


NOTE = "Bring a coat: the forecast says rain at noon and wind from the sea. " * 4
ANSWERS = {  # the call's header as gpt-oss writes it, and as openai-harmony renders it back
    "recipient_after_channel": "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
    "recipient_in_header": " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>",
}


@pytest.mark.parametrize("header", sorted(ANSWERS))
def test_the_token_parser_reads_real_ids_as_the_text_parser_reads_the_text(header, encoding):
    arguments = json.dumps({"city": "Paris", "note": NOTE})
    answer = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary"
              "<|message|>Checking.<|end|><|start|>assistant" + ANSWERS[header] + arguments + "<|call|>")
    ids = encoding.encode(answer.removeprefix(" "), allowed_special="all")
    by_tokens = HarmonyTokenParser(encoding, parse_tools=True)
    steps = [by_tokens.feed(encoding.decode([token]), [token]) for token in ids] + [by_tokens.finish()]
    assert by_tokens.fallback is None  # the library read every token
    by_text = HarmonyTextParser(parse_tools=True)
    text_parts = by_text.feed(answer) + by_text.finish()
    streamed = [part for step in steps for part in step]
    assert joined(streamed) == joined(text_parts) == ("Need the weather.", "Checking.", [("get_weather", arguments)])
    opened = next(i for i, step in enumerate(steps) if any(p["type"] == "tool_call" for p in step))
    fragments = [i for i, step in enumerate(steps) if any(p["type"] == "arguments" for p in step)]
    assert len(fragments) > 20 and fragments[0] >= opened  # the name first, then the arguments as generated


def test_the_tiny_gpt_oss_template_renders_a_tool_round_trip_as_openai_harmony_does(encoding):
    from openai_harmony import Author, Conversation, Message, Role

    from workers.tiny.builders import train_tokenizer
    from workers.tiny.chat_formats import format_tokenizer

    tokenizer = format_tokenizer("openai", train_tokenizer(300))
    arguments = {"city": "Paris"}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Need the weather.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = encoding.decode(encoding.render_conversation_for_completion(Conversation.from_messages([
        Message.from_role_and_content(Role.USER, "Weather in Paris?"),
        Message.from_role_and_content(Role.ASSISTANT, "Need the weather.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, json.dumps(arguments)).with_channel("commentary")
        .with_recipient("functions.get_weather").with_content_type("<|constrain|>json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_weather"), "22 C")
        .with_channel("commentary").with_recipient("assistant"),
    ]), Role.ASSISTANT))
    assert rendered[rendered.index("<|start|>user"):] == expected
