"""`manage.py client`: talk to a running server from the terminal (plain HTTP, no Django needed on the far side).

One chat turn (`--message`), a completion (`--completion`, or a prompt piped on stdin), an
interactive chat (a TTY with neither), or `--list-models` / `--health`.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from django.core.management.base import BaseCommand, CommandError

from inference_site import version_line
from protocol import MODEL_SAMPLING_KEYS

from ..config_files import CLIENT_KEYS, load_config, merged_options

DEFAULTS = {"url": "http://127.0.0.1:8000/v1", "echo": True, "stream": False, "show_usage": False}
# Request fields the client sends when set (flag or config file).
SAMPLING_FIELDS = ("max_tokens", *MODEL_SAMPLING_KEYS,
                   "no_repeat_ngram_size", "min_length", "num_beams", "ignore_eos", "seed", "stop")
HELP = "Commands: /clear (forget the conversation), /system TEXT (set the system prompt), /help, quit (or q)"
REPLY_TOKENS = 256  # an interactive reply's default length, when the context has room for it
MIN_REPLY_TOKENS = 32  # below this much room, the oldest turns are dropped


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def find_api_key(url: str, explicit: str | None) -> str | None:
    """--api-key, then OPENAI_API_KEY / INFERENCE_API_KEY, then (loopback only) the key file `serve` wrote."""
    key = explicit or os.environ.get("OPENAI_API_KEY") or os.environ.get("INFERENCE_API_KEY")
    if key or not is_loopback(url):
        return key
    from teams.services import key_file_path

    port = urlsplit(url).port or (443 if url.startswith("https") else 80)
    path = key_file_path(port)
    return path.read_text().strip() if path.exists() else None


def key_from_file(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise CommandError(f"--auth-token-file: cannot read {path}: {exc.strerror}") from None


class Client:
    """The few calls the command makes, with OpenAI error bodies turned into CommandErrors."""

    def __init__(self, url: str, key: str | None, timeout: float = 600) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(headers=headers, timeout=timeout)

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            response.read()
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise CommandError(f"{response.status_code}: {message}")
        return response

    def get(self, path: str) -> dict:
        try:
            return self._check(self.http.get(self.url + path)).json()
        except httpx.HTTPError as exc:
            raise CommandError(f"Cannot reach {self.url}: {exc}") from exc

    @property
    def root(self) -> str:
        return self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url

    def context_left(self, model: str, messages: list[dict]) -> int | None:
        """Tokens of context the conversation leaves (negative: it is over), from the server's /tokenize;
        None where the server cannot say."""
        try:
            response = self.http.post(self.root + "/tokenize", json={"model": model, "messages": messages})
            body = response.json()
            if response.status_code == 400 and body["error"]["code"] == "context_length_exceeded":
                return -1
            return int(body["max_model_len"]) - int(body["count"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def health(self) -> dict:
        root = self.root
        try:
            return self._check(self.http.get(root + "/health")).json()
        except httpx.HTTPError as exc:
            raise CommandError(f"Cannot reach {root}: {exc}") from exc

    def post(self, path: str, body: dict) -> dict:
        try:
            return self._check(self.http.post(self.url + path, json=body)).json()
        except httpx.HTTPError as exc:
            raise CommandError(f"Cannot reach {self.url}: {exc}") from exc

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        try:
            with self.http.stream("POST", self.url + path, json={**body, "stream": True}) as response:
                self._check(response)
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        raise CommandError(event["error"].get("message", "stream error"))
                    yield event
        except httpx.HTTPError as exc:
            raise CommandError(f"Cannot reach {self.url}: {exc}") from exc


class Command(BaseCommand):
    help = "A terminal client for an OpenAI-compatible server: chat, completions, models, health."

    def get_version(self) -> str:
        return version_line()

    def add_arguments(self, parser):
        parser.add_argument("--config", metavar="FILE", help="a YAML client config (see the README); flags override it")
        parser.add_argument("--url", help="the server's /v1 URL (default http://127.0.0.1:8000/v1)")
        parser.add_argument("--model", help="default: the first of /v1/models")
        parser.add_argument("--api-key", "--auth-token", dest="api_key",
                            help="default: $OPENAI_API_KEY, $INFERENCE_API_KEY, or the local key file")
        parser.add_argument("--auth-token-file", metavar="FILE", help="read the key from this file (forgather's)")
        parser.add_argument("--interactive", action="store_true", help="chat interactively (even with stdin piped)")
        parser.add_argument("--message", help="send one chat message and print the answer")
        parser.add_argument("--system", help="system prompt for chat")
        parser.add_argument("--completion", help="complete this text (a piped stdin does the same)")
        parser.add_argument("--echo", action=argparse.BooleanOptionalAction, default=None,
                            help="print the prompt before a completion (default: on)")
        parser.add_argument("--stream", action="store_true", default=None, help="print tokens as they arrive")
        parser.add_argument("--max-tokens", type=int)
        parser.add_argument("--temperature", type=float)
        parser.add_argument("--top-p", type=float)
        parser.add_argument("--top-k", type=int)
        parser.add_argument("--repetition-penalty", type=float)
        parser.add_argument("--min-p", type=float)
        parser.add_argument("--typical-p", type=float)
        parser.add_argument("--no-repeat-ngram-size", type=int)
        parser.add_argument("--min-length", type=int, help="minimum length, prompt included (Hugging Face's)")
        parser.add_argument("--num-beams", type=int, help="beam search with this many beams")
        parser.add_argument("--ignore-eos", action="store_true", default=None)
        parser.add_argument("--seed", type=int)
        parser.add_argument("--stop", action="append", help="a stop string (repeatable)")
        parser.add_argument("--list-models", action="store_true")
        parser.add_argument("--health", action="store_true")
        parser.add_argument("--show-usage", action="store_true", default=None, help="print token usage to stderr")

    def handle(self, *args, **options):
        config = load_config(options["config"], CLIENT_KEYS) if options.get("config") else {}
        options = merged_options(options, config, DEFAULTS)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # no request log lines in the output
        client = Client(options["url"], find_api_key(options["url"], options["api_key"] or key_from_file(
            options.get("auth_token_file"))))
        if options["health"]:
            return self.stdout.write(json.dumps(client.health()))
        if options["list_models"]:
            for model in client.get("/models")["data"]:
                self.stdout.write(model["id"])
            return
        self.client, self.options = client, options
        self.model = options["model"] or self._first_model()
        if options["completion"] is not None:
            return self.complete(options["completion"])
        if options["message"] is not None:
            self.chat_turn(self._start_messages() + [{"role": "user", "content": options["message"]}])
            return  # (a returned string would be printed again by BaseCommand)
        if not sys.stdin.isatty() and not options.get("interactive"):
            return self.complete(sys.stdin.read().removesuffix("\n"))  # `echo "…" |` adds a newline
        self.interactive()

    def _first_model(self) -> str:
        models = self.client.get("/models")["data"]
        if not models:
            raise CommandError("The server lists no models; pass --model.")
        return models[0]["id"]

    def _start_messages(self) -> list[dict]:
        return [{"role": "system", "content": self.options["system"]}] if self.options["system"] else []

    def _sampling(self) -> dict:
        body = {field: self.options[field] for field in SAMPLING_FIELDS if self.options.get(field) is not None}
        if self.options["stream"] and self.options["show_usage"]:
            body["stream_options"] = {"include_usage": True}
        return {"model": self.model, **body}

    def _write(self, text: str) -> None:
        self.stdout.write(text, ending="")
        self.stdout.flush()

    def _usage(self, usage: dict | None) -> None:
        if self.options["show_usage"] and usage:
            self.stderr.write(f"[usage] prompt {usage['prompt_tokens']} + completion {usage['completion_tokens']}"
                              f" = {usage['total_tokens']} tokens")

    def complete(self, prompt: str) -> None:
        body = {**self._sampling(), "prompt": prompt, "echo": False}
        if self.options["echo"]:
            self._write(prompt)
        if self.options["stream"]:
            usage = None
            for chunk in self.client.stream("/completions", body):
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", ()):
                    self._write(choice["text"])
        else:
            result = self.client.post("/completions", body)
            self._write(result["choices"][0]["text"])
            usage = result.get("usage")
        self._write("\n")
        self._usage(usage)

    def fit_context(self, messages: list[dict]) -> tuple[list[dict], int | None]:
        """Without --max-tokens: drop the oldest turns until a reply has room, and cap the reply to that room.

        Returns the messages to send and the reply's max_tokens (None: the server's default, where
        the server cannot count tokens).
        """
        while True:
            left = self.client.context_left(self.model, messages)
            if left is None:
                return messages, None
            oldest = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
            if left >= MIN_REPLY_TOKENS or oldest is None or oldest == len(messages) - 1:
                return messages, max(1, min(REPLY_TOKENS, left))
            messages = messages[:oldest] + messages[oldest + 2:]  # a user turn and its answer
            self.stderr.write("(dropped the oldest turn to fit the model's context)")

    def chat_turn(self, messages: list[dict], max_tokens: int | None = None) -> str:
        """Send the conversation, print the answer (reasoning dimmed to stderr), return the content."""
        body = {**self._sampling(), "messages": messages}
        if max_tokens is not None and "max_tokens" not in body:
            body["max_tokens"] = max_tokens
        content, usage = "", None
        if self.options["stream"]:
            for chunk in self.client.stream("/chat/completions", body):
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", ()):
                    delta = choice["delta"]
                    if delta.get("reasoning_content"):
                        self.stderr.write(delta["reasoning_content"], ending="")
                    if delta.get("content"):
                        content += delta["content"]
                        self._write(delta["content"])
        else:
            result = self.client.post("/chat/completions", body)
            message = result["choices"][0]["message"]
            if message.get("reasoning_content"):
                self.stderr.write(f"[reasoning] {message['reasoning_content']}")
            content = message.get("content") or ""
            for call in message.get("tool_calls") or ():
                self.stdout.write(f"[tool call] {call['function']['name']}({call['function']['arguments']})")
            self._write(content)
            usage = result.get("usage")
        self._write("\n")
        self._usage(usage)
        return content

    def interactive(self) -> None:
        self.stdout.write(f"Chatting with {self.model} at {self.options['url']}. {HELP}")
        messages = self._start_messages()
        while True:
            try:
                line = input("> ").strip()
            except (EOFError, KeyboardInterrupt):
                self._write("\n")
                return
            if line in ("q", "quit", "exit", "/quit", "/exit"):
                return
            if not line:
                continue
            if line == "/help":
                self.stdout.write(HELP)
            elif line == "/clear":
                messages = [m for m in messages if m["role"] == "system"]
                self.stdout.write("(conversation cleared)")
            elif line.startswith("/system"):
                messages = [{"role": "system", "content": line[len("/system"):].strip()}] + \
                    [m for m in messages if m["role"] != "system"]
                self.stdout.write("(system prompt set)")
            else:
                messages.append({"role": "user", "content": line})
                try:
                    max_tokens = None
                    if self.options["max_tokens"] is None:
                        messages, max_tokens = self.fit_context(messages)
                    messages.append({"role": "assistant", "content": self.chat_turn(messages, max_tokens)})
                except CommandError as exc:
                    messages.pop()
                    self.stderr.write(f"error: {exc}")
