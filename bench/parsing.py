"""`python -m bench.run --scenario parsing`: what splitting a chat answer costs per streamed token.

The worker parses every chat and Responses answer as its family writes it (workers/engine/output/parsing):
each step's new text goes through the choice's parser. Two figures, from one run:

- the parser's cost per token, per family: a realistic answer (reasoning, content and a tool call,
  ~`--tokens` tokens of the model's tokenizer; `*_long_call`: one call whose streamed arguments are
  the whole answer) fed to that family's parser one token's text at a time, as the worker feeds it,
  the median of `--repeats` passes;
- the CPU our server spends per streamed token: one greedy streamed chat of `--tokens` tokens (tools
  given, so the parse path runs) against `manage.py serve`, the server process's CPU time (user +
  system, its threads and children) over the tokens it streamed.

Their ratio is the share of a stream's CPU that parsing takes (the target: at most 5 %). Writes
bench/results/parsing.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from .run import ROOT, ensure_model, positive_int
from .servers import OurServer

PROSE = ("The weather in the city depends on the season, the wind from the sea and the hills around it; "
         "in spring the mornings are cool and the afternoons warm, and rain comes in short showers. ")
CALL_ARGS = '{"city": "Paris", "days": 3}'
ANSWERS = {  # family -> (tool parser, reasoning parser, answer with REASONING and CONTENT to fill)
    "hermes": ("hermes", "qwen3", '<think>\nREASONING\n</think>\n\nCONTENT\n<tool_call>\n{"name": "get_weather", '
               '"arguments": ' + CALL_ARGS + '}\n</tool_call>'),
    "qwen3_coder": ("qwen3_coder", "qwen3", "<think>\nREASONING\n</think>\n\nCONTENT\n<tool_call>\n<function=get_weather>"
                    "\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
    "llama3_json": ("llama3_json", None, 'CONTENT<|python_tag|>{"name": "get_weather", "parameters": ' + CALL_ARGS + "}"),
    "mistral": ("mistral", "mistral", "[THINK]REASONING[/THINK]CONTENT[TOOL_CALLS]get_weather[ARGS]" + CALL_ARGS),
    "deepseek_v31": ("deepseek_v31", "deepseek_r1", "<think>REASONING</think>CONTENT<｜tool▁calls▁begin｜>"
                     "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + CALL_ARGS + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "gemma4": ("gemma4", "gemma4", '<|channel>thought\nREASONING<channel|>CONTENT<|tool_call>call:get_weather'
               '{city:<|"|>Paris<|"|>,days:3}<tool_call|>'),
    "openai": ("openai", "openai_gptoss", "<|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>"
               "final<|message|>CONTENT<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
               "<|constrain|>json<|message|>" + CALL_ARGS),
    "response_template": ("response_template", "response_template", '<think>REASONING</think>CONTENT<tool_call>'
                          '{"name": "get_weather", "arguments": ' + CALL_ARGS + '}</tool_call>'),
    # a call whose arguments are most of the answer, streamed as written (JSON) or translated (XML)
    "hermes_long_call": ("hermes", "qwen3", '<tool_call>\n{"name": "get_weather", "arguments": {"note": "REASONING '
                         'CONTENT"}}\n</tool_call>'),
    "qwen3_coder_long_call": ("qwen3_coder", "qwen3", "<tool_call>\n<function=get_weather>\n<parameter=note>\nREASONING "
                              "CONTENT\n</parameter>\n</function>\n</tool_call>"),
}


def token_pieces(tokenizer, text: str) -> list[str]:
    """`text` as the worker hands it to a parser: one token's new text at a time."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces, before = [], ""
    for end in range(1, len(ids) + 1):
        now = tokenizer.decode(ids[:end])
        if now.endswith("\ufffd") and end < len(ids):  # part of a character: the worker holds it back
            pieces.append("")
            continue
        pieces.append(now[len(before):])
        before = now
    return pieces


def answer_text(family: str, tokenizer, tokens: int) -> str:
    """The family's answer with reasoning and content long enough for about `tokens` tokens."""
    _, _, shape = ANSWERS[family]
    per_sentence = max(len(tokenizer(PROSE, add_special_tokens=False)["input_ids"]), 1)
    sentences = max(tokens // (2 * per_sentence), 1)
    return shape.replace("REASONING", (PROSE * sentences).strip()).replace("CONTENT", (PROSE * sentences).strip())


def parser_for(family: str):
    from protocol.output_formats import ParserChoice
    from workers.engine.output.parsing.factory import OutputFormat, make_parser
    from workers.tiny.chat_formats import QWEN_RESPONSE_TEMPLATE

    tool, reasoning, _ = ANSWERS[family]
    choice = ParserChoice(tool, reasoning, "bench")
    fmt = OutputFormat(choice, choice, QWEN_RESPONSE_TEMPLATE if family == "response_template" else None)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    return make_parser(fmt, "<|im_start|>assistant\n", tools, True)


def parse_cost(family: str, pieces: list[str], repeats: int) -> dict:
    """Microseconds per token to parse `pieces` with `family`'s parser (median of `repeats` passes)."""
    passes, calls = [], 0
    for _ in range(repeats):
        parser = parser_for(family)
        started = time.perf_counter()
        parts = [part for piece in pieces for part in parser.feed(piece, [0])] + parser.finish()
        passes.append((time.perf_counter() - started) / len(pieces) * 1e6)
        calls = sum(part["type"] == "tool_call" for part in parts)
    return {"us_per_token": statistics.median(passes), "tokens": len(pieces), "calls": calls}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children so far."""
    process = psutil.Process(pid)
    total = 0.0
    for proc in [process, *process.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def stream_cpu(base_url: str, pid: int, model: str, tokens: int) -> dict:
    """One greedy streamed chat of `tokens` tokens with tools given: the server's CPU per streamed token."""
    body = {"model": model, "messages": [{"role": "user", "content": "What is the weather like?"}], "stream": True,
            "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}
    before, started, chunks = process_cpu(pid), time.perf_counter(), 0
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            chunks += line.startswith("data: {")
    cpu = process_cpu(pid) - before
    return {"cpu_s": cpu, "wall_s": time.perf_counter() - started, "tokens": tokens, "chunks": chunks,
            "us_per_token": cpu / tokens * 1e6}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--tokens", type=positive_int, default=256)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--quick", action="store_true", help="the tiny model, 48 tokens, 2 passes")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.tokens, args.repeats = "local/tiny-llama", "tiny", 48, 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv or [])
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants
    from transformers import AutoTokenizer

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    ensure_model(args.model, args.size, cache)
    tokenizer = AutoTokenizer.from_pretrained(args.model, cache_dir=cache, local_files_only=True)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-parsing-")))
    try:
        stream_cpu(server.base_url, server.pid, args.model, 4)  # warm: the worker imported torch, loaded the model
        streams = [stream_cpu(server.base_url, server.pid, args.model, args.tokens) for _ in range(args.repeats)]
    finally:
        server.stop()
    stream_us = statistics.median(s["us_per_token"] for s in streams)
    families = {}
    for family in ANSWERS:
        cost = parse_cost(family, token_pieces(tokenizer, answer_text(family, tokenizer, args.tokens)), args.repeats)
        families[family] = {**cost, "share_of_stream_cpu": cost["us_per_token"] / stream_us}
    report = {"model": args.model, "tokens": args.tokens, "repeats": args.repeats, "cpus": os.cpu_count(),
              "stream_cpu_us_per_token": stream_us, "streams": streams, "families": families,
              "worst_share": max(f["share_of_stream_cpu"] for f in families.values())}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parsing.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Parse cost per streamed token ({args.model}, {args.tokens} tokens, median of {args.repeats})", "",
             f"Server CPU per streamed token: {stream_us:.0f} us", "",
             "| family | parse us/token | share of the stream's CPU |", "|---|---|---|"]
    lines += [f"| {name} | {row['us_per_token']:.1f} | {100 * row['share_of_stream_cpu']:.2f} % |"
              for name, row in families.items()]
    (args.out / "parsing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
