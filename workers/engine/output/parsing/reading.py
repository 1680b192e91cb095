"""A tool-call region's body read as it arrives: a call opens as soon as its name is read, its arguments
stream as they are generated.

A family's call syntax (families.py) is a generator over a `CallReader`: it reads with the helpers below
(`yield from reader.accept("<marker>")`, …), which wait (yield) while the text so far cannot settle
them, and it announces calls (`open`) and argument fragments (`arguments`, `key`) as it goes. The
joined output depends on the text alone, never on how it was cut into pieces. Text that stops being
calls raises `NotCalls` (or any parse error): before a call has opened, the text since the last whole
call is content; inside one, the call ends as far as it was written and the rest is content.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Generator, Iterable

from protocol import Part

from . import parts
from .markers import earliest, partial_suffix

Waits = Generator[None, None, object]  # a helper that yields while it waits for more text
CallSyntax = Callable[["CallReader"], Generator[None, None, None]]

WHITESPACE = " \t\r\n"
NAME = re.compile(r"[\w.\-]+")
NAME_TEXT = re.compile(r"\s*[\w.\-]*\s*")  # what a name's text may hold while it is read
NAME_LIMIT = 256  # a name (or a call's header) longer than this is not one
JSON_QUOTES = (('"', '"', True),)  # (opening, closing, backslash escapes) of a value's strings
PARSE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, SyntaxError,
                MemoryError)


class NotCalls(ValueError):
    """The body stopped being tool calls."""


class CallReader:
    """One tool-call region's reader: `feed` it the body's text; it emits Parts into the list it is given."""

    def __init__(self, syntax: CallSyntax, calls: parts.Calls, schemas: dict) -> None:
        self.text, self.pos = "", 0
        self.final = self.closed = False
        self.calls, self.schemas = calls, schemas
        self.out: list[Part] = []
        self.mark = 0  # where the text that is no whole call yet starts
        self.name: str | None = None  # the open call's (None: no call open)
        self.index: int | None = None  # its index (None: dropped, past parallel_tool_calls' limit)
        self.translated = False  # its arguments are written by us (JSON from another syntax)
        self.keys = 0  # the parameters a translated call has written
        self.opened = 0
        self.dead = False
        self.run = syntax(self)

    def feed(self, text: str, out: list[Part], final: bool = False, closed: bool = False) -> str | None:
        """Read `text` (`final`: the region ended; `closed`: where it should, at its closing marker or, for a
        region that has none, the answer's end; not cut); returns the text that is not calls (then the
        reader is done), else None."""
        if self.dead:
            return text
        self.text += text
        self.final, self.closed, self.out = final, closed, out
        try:
            self.run.send(None)
            return None
        except StopIteration:
            self.dead = True
            if self.opened:
                return None
            failed = self.mark
        except PARSE_ERRORS:
            self.dead = True
            failed = self.pos if self.name is not None else self.mark
            if self.name is not None and final and not self.text[failed:].strip():
                return None  # the region ended inside a call: it ends as far as it was written
        return self.text[failed:]

    # --- what the syntax announces ----------------------------------------------------------
    def open(self, name: str, translated: bool = False) -> None:
        """A call opens: its index, id and name go out now; `translated`: its arguments are JSON we write."""
        name = name.strip()
        if not NAME.fullmatch(name):
            raise NotCalls(name)
        self.name, self.translated, self.keys = name, translated, 0
        self.index = self.calls.open(name, self.out)
        self.opened += 1
        if translated:
            self.arguments("{")

    def arguments(self, text: str) -> None:
        if text and self.name is not None and self.index is not None:
            self.out.append(parts.arguments(self.index, text))

    def key(self, key: str) -> None:
        """A translated call's next parameter: its key (its value follows)."""
        if not key.strip():
            raise NotCalls("a parameter without a name")
        self.arguments((", " if self.keys else "") + json.dumps(key.strip(), ensure_ascii=False) + ": ")
        self.keys += 1

    def string_piece(self, text: str) -> None:
        """Part of a translated string value."""
        self.arguments(json.dumps(text, ensure_ascii=False)[1:-1])

    def end_call(self, complete: bool = True) -> None:
        """The call is over; a translated one's object is closed unless it was cut (`complete` False)."""
        if self.translated and complete:
            self.arguments("}")
        self.name = self.index = None
        self.mark = self.pos

    def settle(self) -> None:
        """What was read so far belongs to no call's text (a closing bracket of the calls' list)."""
        self.mark = self.pos

    def unread(self, marker: str) -> None:
        self.pos -= len(marker)

    # --- reading (generators: `yield from`) ------------------------------------------------
    def next_call(self, opening: str) -> Waits:
        """Whether another call follows (its `opening` read); False at the end, NotCalls for other text."""
        yield from self.skip()
        if (yield from self.accept(opening)):
            return True
        if (yield from self.at_end()):
            return False
        raise NotCalls(self.text[self.pos:self.pos + 20])

    def open_named(self, stops: tuple[str, ...], allowed: re.Pattern = NAME_TEXT, translated: bool = False) -> Waits:
        """Read a call's name up to one of `stops` and open the call; the stop that ended the name."""
        name, marker = yield from self.until(stops, allowed=allowed, limit=NAME_LIMIT)
        if marker is None:
            raise NotCalls(name)
        self.open(name, translated)
        return marker

    def _held(self, text: str, markers: tuple[str, ...]) -> int:
        """How much of the text's end may be the start of a marker, held back until more text settles it;
        at a cut (the answer ended inside the region) it is never written."""
        return 0 if self.final and self.closed else partial_suffix(text, markers)

    def more(self) -> Waits:
        """Wait for more text; False when no more will come."""
        if self.final:
            return False
        yield
        return True

    def peek(self, count: int = 1) -> Waits:
        """The next `count` characters (fewer at the end), unread."""
        while len(self.text) - self.pos < count and (yield from self.more()):
            pass
        return self.text[self.pos:self.pos + count]

    def at_end(self) -> Waits:
        return not (yield from self.peek())

    def skip(self, chars: str = WHITESPACE) -> Waits:
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in chars:
                self.pos += 1
            if self.pos < len(self.text) or not (yield from self.more()):
                return None

    def accept(self, literal: str) -> Waits:
        """Read `literal` if the text goes on with it (True), else read nothing (False)."""
        while True:
            got = self.text[self.pos:self.pos + len(literal)]
            if got == literal:
                self.pos += len(literal)
                return True
            if not literal.startswith(got) or not (yield from self.more()):
                return False

    def until(self, stops: Iterable[str], emit: Callable[[str], None] | None = None,
              allowed: re.Pattern | None = None, limit: int | None = None) -> Waits:
        """(the text up to the first of `stops`, that stop) with the stop read; (the rest, None) at the end.
        `emit` gets the text's pieces as they settle (a possible stop's start held back); NotCalls when
        the text stops matching `allowed` or grows past `limit`."""
        stops = tuple(stops)
        start = sent = self.pos
        while True:
            found = earliest(self.text, stops, sent)
            end = found[0] if found else len(self.text) - self._held(self.text, stops)
            end = max(end, sent)
            if (allowed is not None and not allowed.fullmatch(self.text, start, end)) or \
                    (limit is not None and end - start > limit):
                raise NotCalls(self.text[start:end])
            if emit is not None and end > sent:
                emit(self.text[sent:end])
            sent = end
            if found:
                self.pos = found[0] + len(found[1])
                return self.text[start:found[0]], found[1]
            if not (yield from self.more()):
                self.pos = len(self.text)
                return self.text[start:], None

    def nested(self, quotes=JSON_QUOTES, ends: str = "", stops: tuple[str, ...] = (),
               emit: Callable[[str], None] | None = None) -> Waits:
        """A value's text as written, its brackets and quoted strings followed: it ends where its opening
        bracket or quote closes (`ends` empty), or before a character of `ends` met outside them, or
        before one of `stops` (markers no value holds), or at the end of the text. `emit` gets its
        pieces as they are read."""
        start = sent = index = self.pos
        depth, quote, escaped = 0, None, False
        watched = tuple(stops) + tuple(mark for quote_kind in quotes for mark in quote_kind[:2] if len(mark) > 1)
        while True:
            text = self.text
            found = earliest(text, stops, index) if stops else None
            limit = found[0] if found else len(text) - self._held(text, watched)
            done = None
            while index < limit and done is None:
                char = text[index]
                if quote is not None:
                    if escaped:
                        escaped = False
                    elif quote[2] and char == "\\":
                        escaped = True
                    elif text.startswith(quote[1], index):
                        index += len(quote[1]) - 1
                        quote = None
                        if depth == 0 and not ends:
                            done = index + 1
                elif depth == 0 and char in ends:
                    done = index
                    break
                elif (opening := next((q for q in quotes if text.startswith(q[0], index)), None)) is not None:
                    quote = opening
                    index += len(opening[0]) - 1
                elif char in "{[(":
                    depth += 1
                elif char in "}])":
                    depth -= 1
                    if depth <= 0 and not ends:
                        done = index + 1
                index += 1
            end = done if done is not None else max(limit, sent)
            if emit is not None and end > sent:
                emit(text[sent:end])
            sent = end
            if done is not None or found or not (yield from self.more()):
                self.pos = done if done is not None else (found[0] if found else len(self.text))
                return self.text[start:self.pos]

    def python_string(self, emit: Callable[[str], None]) -> Waits:
        """A '…' or "…" literal (at the cursor), its decoded text emitted as it settles; True once it closed."""
        quote = self.text[self.pos]
        self.pos += 1
        sent = index = self.pos
        escape = -1  # where the last escape started
        while True:
            text = self.text
            while index < len(text):
                char = text[index]
                if char == "\\":
                    escape = index
                    index += 2
                    continue
                if char == quote:
                    emit(ast.literal_eval(quote + text[sent:index] + quote))
                    self.pos = index + 1
                    return True
                index += 1
            safe = len(text)
            if not (self.final and self.closed) and escape >= sent and (len(text) - escape < 10 or (
                    text.startswith("\\N{", escape) and "}" not in text[escape:])):
                safe = escape  # an escape that may not be whole yet
            if safe > sent:
                emit(ast.literal_eval(quote + text[sent:safe] + quote))
                sent = safe
            if not (yield from self.more()):
                self.pos = len(self.text)
                return False
