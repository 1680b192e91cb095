"""Grammars for constrained decoding, compiled by llguidance off the engine thread.

Compiling a grammar against a tokenizer (building its lexer over the vocabulary) can take
long for a hostile schema, so it never runs on the engine thread: `GrammarCompiler.submit`
returns a Future from a small pool, the engine admits the job when it resolves and refuses
it (400) when it fails or outlives `timeout`. A compiled matcher is kept in an LRU cache keyed
by tokenizer and spec; each constrained choice decodes with its own cheap copy of it.

A job's `structured` parameter (protocol) is one of
    {"type": "json_schema", "schema": {...}}      (json_object is the schema {"type": "object"})
    {"type": "regex", "pattern": str}
    {"type": "choice", "choices": [str, ...]}
    {"type": "grammar", "grammar": str}            (Lark or GBNF)
    {"type": "tool_call", "tools": [{"name", "parameters"}], "many"?, "syntax"}
                                                   (calls in the model's syntax: parsing/tool_grammars.py)
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import llguidance.hf
from transformers import PreTrainedTokenizerBase

from protocol import ErrorMessage, Structured, error_message
from workers.engine.output.parsing.tool_grammars import JSON_OPTIONS, tool_call_grammar

logger = logging.getLogger(__name__)

PARAM_BY_TYPE = {"json_schema": "response_format", "regex": "structured_outputs", "choice": "structured_outputs",
                 "grammar": "structured_outputs", "tool_call": "tool_choice"}


class GrammarError(Exception):
    """A grammar the backend refuses; the message names the part it cannot handle."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_grammar") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def grammar_text(spec: dict, tokenizer: PreTrainedTokenizerBase) -> str:
    """The llguidance grammar (not yet checked) for a job's `structured` parameter."""
    kind = spec.get("type")
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(spec["schema"]), overrides=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec["pattern"])
    if kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec["choices"]))
    if kind == "grammar":
        return llguidance.grammar_from("grammar", spec["grammar"])
    if kind == "tool_call":
        return llguidance.LLMatcher.grammar_from_lark(tool_call_grammar(spec, tokenizer))
    raise GrammarError(f"Unknown structured output type {kind!r}.", "structured_outputs")


def compiled_or_error(future: Future, spec: Structured, timeout: float) -> tuple[llguidance.LLMatcher | None,
                                                                               ErrorMessage | None]:
    """A finished (or overdue) compile as the template matcher, or the 400 the request gets instead."""
    param = PARAM_BY_TYPE.get(spec["type"])
    if not future.done():
        return None, error_message(400, f"Compiling the grammar took longer than {timeout:g}s; simplify it.",
                                   param, "grammar_compile_timeout")
    try:
        return future.result(), None
    except GrammarError as exc:
        return None, error_message(400, exc.message, exc.param or param, exc.code)
    except Exception as exc:
        logger.exception("grammar compilation failed")
        return None, error_message(400, f"The grammar could not be compiled: {exc}", param, "invalid_grammar")


def cache_key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


class GrammarCompiler:
    """Compiles grammars in worker threads; an LRU cache of compiled matchers keyed by tokenizer and spec."""

    def __init__(self, timeout: float = 10.0, cache_size: int = 64, threads: int = 2) -> None:
        self.timeout = timeout
        self.cache_size = cache_size
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="grammar-compiler")
        self._lock = threading.Lock()
        self._compiled: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._tokenizers: dict[str, llguidance.LLTokenizer] = {}

    def submit(self, model_key: str, tokenizer: PreTrainedTokenizerBase, vocab_size: int, spec: dict) -> Future:
        """A Future of the compiled template matcher (copy it per choice with `deep_copy()`)."""
        key = (model_key, cache_key(spec))
        with self._lock:
            future = self._compiled.get(key)
            if future is not None and not (future.done() and future.exception() is not None):
                self._compiled.move_to_end(key)
                return future
            future = self._pool.submit(self._compile, model_key, tokenizer, vocab_size, spec)
            self._compiled[key] = future
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return future

    def forget(self, model_key: str) -> None:
        """A model was unloaded: drop its tokenizer and grammars."""
        with self._lock:
            self._tokenizers.pop(model_key, None)
            for key in [k for k in self._compiled if k[0] == model_key]:
                del self._compiled[key]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _ll_tokenizer(self, model_key: str, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> llguidance.LLTokenizer:
        with self._lock:
            cached = self._tokenizers.get(model_key)
        if cached is None:
            try:
                cached = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
            except ValueError as exc:  # a slow (Python) tokenizer
                raise GrammarError(f"Structured outputs need a fast tokenizer: {exc}", None, "unsupported") from exc
            with self._lock:
                self._tokenizers[model_key] = cached
        return cached

    def _compile(self, model_key: str, tokenizer: PreTrainedTokenizerBase, vocab_size: int,
                 spec: dict) -> llguidance.LLMatcher:
        param = PARAM_BY_TYPE.get(spec.get("type"), "structured_outputs")
        ll_tokenizer = self._ll_tokenizer(model_key, tokenizer, vocab_size)
        try:
            grammar = grammar_text(spec, tokenizer)
        except ValueError as exc:
            raise GrammarError(f"Invalid grammar: {exc}", param) from exc
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer)
        if failed:
            raise GrammarError(f"Unsupported {spec['type']}: {messages[0].strip()}", param)
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"Unsupported {spec['type']}: {matcher.get_error().strip()}", param)
        return matcher


class PendingGrammars:
    """Requests waiting outside the batch for their grammar; each resolves to a matcher or the 400 it gets."""

    def __init__(self, compiler: GrammarCompiler, wake: Callable[[], None]) -> None:
        self.compiler, self.wake = compiler, wake
        self._pending: dict[str, tuple[object, Future, float]] = {}  # request id -> (request, grammar, deadline)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, request) -> None:
        """Start compiling (or find cached) a workers.engine.sequences.GenerationJob's grammar; `wake` is called when it is ready."""
        model = request.model
        future = self.compiler.submit(request.model_name, model.tokenizer, model.vocab_size, request.structured)
        self._pending[request.request_id] = (request, future, time.monotonic() + self.compiler.timeout)
        future.add_done_callback(lambda _f: self.wake())

    def cancel(self, request_id: str) -> bool:
        return self._pending.pop(request_id, None) is not None

    def models(self) -> set[str]:
        return {request.model_name for request, _, _ in self._pending.values()}

    def resolved(self) -> list[tuple[object, llguidance.LLMatcher | None, ErrorMessage | None]]:
        """(request, template matcher, None) or (request, None, its 400) for each grammar done or overdue."""
        now, done = time.monotonic(), []
        for request_id, (request, future, deadline) in list(self._pending.items()):
            if future.done() or now >= deadline:
                del self._pending[request_id]
                done.append((request, *compiled_or_error(future, request.structured, self.compiler.timeout)))
        return done
