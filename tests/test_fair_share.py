"""Fair share and priority inside the engine: the real engine and tiny model, no server.

A full box (few slots) flooded by one team: another team's request starts within a step or two (its
prefill before that step's decode), interactive work pauses batch work (down to
`batch_rows_beside_interactive` rows), and every paused sequence resumes to exactly the tokens it
would have produced uninterrupted (greedy equal to `model.generate`).
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY

import protocol
from workers.engine.config import EngineConfig
from workers.engine.core.engine import Engine
from workers.engine.core.fair_share import FairQueue

from .conftest import TINY_MODEL, engine_running


@dataclass
class Waiting:
    """What the queue reads of a sequence."""

    team: str
    share: float = 1.0
    priority_class: str = "interactive"
    finished: bool = False


def test_the_least_served_team_goes_next_and_an_idle_team_cannot_bank_credit():
    queue = FairQueue()
    flood = [Waiting("a") for _ in range(5)]
    queue.extend(flood)
    first = queue.pop()
    queue.charge(first, prompt_tokens=100, generated=50)
    late = Waiting("b")
    queue.extend([late], running=[first])  # b rejoins at the least active counter (a's), not at 0
    assert queue.counters["b"] == queue.counters["a"]
    queue.charge(queue.pop(), generated=1)  # a tie goes by name: a, then b is the least served
    assert queue.pop() is late


def test_batch_waits_while_interactive_waits_and_shares_weigh_the_choice():
    queue = FairQueue()
    batch, interactive = Waiting("a", priority_class="batch"), Waiting("b")
    queue.extend([batch, interactive])
    assert queue.pop() is interactive and queue.pop() is batch
    heavy, light = Waiting("h", share=3.0), Waiting("l", share=1.0)
    queue.extend([heavy, light])
    queue.charge(heavy, generated=30)  # 60 weighted tokens / 3 = 20
    queue.charge(light, generated=15)  # 30 / 1 = 30
    assert queue.pop() is heavy


def test_a_team_alone_keeps_the_whole_box_and_a_newcomer_takes_one_row_from_the_richest():
    queue = FairQueue()
    running = [Waiting("a") for _ in range(4)]
    assert queue.to_preempt(running, slots=4) == []  # nobody waits
    queue.extend([Waiting("a")], running=running)
    assert queue.to_preempt(running, slots=4) == []  # only a waits: a keeps its rows
    queue.extend([Waiting("b")], running=running)
    assert queue.to_preempt(running, slots=4) == [running[-1]]
    batch_rows = [Waiting("c", priority_class="batch") for _ in range(4)]
    queue = FairQueue()
    queue.extend([Waiting("d"), Waiting("d")], running=batch_rows)
    assert queue.to_preempt(batch_rows, slots=4) == batch_rows[-2:][::-1]


def test_a_newcomer_tied_with_a_flooding_team_takes_the_slot_before_it():
    queue = FairQueue()
    running = [Waiting("a") for _ in range(4)]
    queue.extend(running[:1])
    queue.charge(queue.pop(), generated=10)
    queue.extend([Waiting("a")], running=running)
    newcomer = Waiting("b")
    queue.extend([newcomer], running=running)  # b rejoins at a's counter: a tie
    assert queue.counters["b"] == queue.counters["a"]
    assert queue.peek(held={"a": 4}) is newcomer  # the team holding fewer rows goes first


def test_batch_rows_beside_interactive_fit_the_device_unless_set():
    assert EngineConfig(max_num_seqs=0).fitted("cuda").batch_rows_beside_interactive == 256  # a GPU: every slot
    assert EngineConfig(max_num_seqs=0).fitted("cpu").batch_rows_beside_interactive == 0  # a CPU: none
    assert EngineConfig(batch_rows_beside_interactive=5).fitted("cpu").batch_rows_beside_interactive == 5


class Outbox:
    def __init__(self) -> None:
        self.messages: dict[str, list[tuple[float, dict]]] = {}
        self.order: list[str] = []  # the channel of every token-carrying message, in the order sent
        self.counts: list[int] = []  # the tokens each of those messages carries
        self.changed = threading.Condition()
        self.hook = None  # called (channel, message) in the output thread, after the message is kept

    def emit(self, channel: str, message: dict) -> None:
        with self.changed:
            self.messages.setdefault(channel, []).append((time.monotonic(), message))
            if message["type"] in (protocol.DELTA, protocol.DONE) and any(c["token_ids"] for c in message["choices"]):
                self.order.append(channel)
                self.counts.append(sum(len(c["token_ids"]) for c in message["choices"]))
            self.changed.notify_all()
        if self.hook is not None:
            self.hook(channel, message)

    def done(self, channel: str) -> bool:
        return any(m["type"] in (protocol.DONE, protocol.ERROR) for _, m in self.messages.get(channel, []))

    def wait_all(self, channels: list[str], timeout: float = 120.0) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: all(self.done(c) for c in channels), timeout)

    def tokens(self, channel: str) -> list[int]:
        return [t for _, m in self.messages[channel] if m["type"] in (protocol.DELTA, protocol.DONE)
                for choice in m["choices"] for t in choice["token_ids"]]

    def wait_tokens(self, channel: str, timeout: float = 60.0) -> None:
        """Until the channel's job produced a token (it is running)."""
        with self.changed:
            assert self.changed.wait_for(lambda: any(
                m["type"] in (protocol.DELTA, protocol.DONE) for _, m in self.messages.get(channel, [])), timeout)

    def first_token_at(self, channel: str) -> float:
        return next(at for at, m in self.messages[channel]
                    if m["type"] in (protocol.DELTA, protocol.DONE) and any(c["token_ids"] for c in m["choices"]))

    def done_at(self, channel: str) -> float:
        return next(at for at, m in self.messages[channel] if m["type"] == protocol.DONE)


@pytest.fixture(scope="module")
def small_box(hf_cache):
    """An engine with 4 slots: a flood of one team fills it."""
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=4)) as engine:
        yield engine, outbox


def submit(engine: Engine, prompt: str, team: str, max_tokens: int, priority_class: str = "interactive",
           share: float = 1.0, stream: bool = False) -> str:
    """A job; `stream`: a message for every step's token (else the first token and the whole answer)."""
    reply = f"reply.{uuid.uuid4().hex}"
    params = protocol.JobParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, priority_class=priority_class,
                                stream=stream)
    engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(TINY_MODEL),
                                          [prompt], params, team={"name": team, "share": share}))
    return reply


def test_another_teams_request_starts_beside_a_flood_and_everyone_gets_their_own_tokens(small_box, reference):
    engine, outbox = small_box
    flood_prompts = [f"Flood {i}: once upon a time" for i in range(8)]
    flood = [submit(engine, p, "a", 200) for p in flood_prompts]
    outbox.wait_tokens(flood[0])  # the flood runs (four rows) and waits (four more)
    b = submit(engine, "A short question", "b", 4)
    outbox.wait_all(flood + [b])
    assert outbox.tokens(b) == reference.greedy(reference.encode("A short question"), 4, min_new_tokens=4)
    # b finished while most of the flood was still going: it did not wait behind the queued four
    assert sum(outbox.done_at(f) > outbox.done_at(b) for f in flood) >= 6
    for prompt, reply in zip(flood_prompts, flood):  # paused and resumed rows lost nothing
        assert outbox.tokens(reply) == reference.greedy(reference.encode(prompt), 200, min_new_tokens=200)



def test_a_row_given_up_to_a_team_owed_it_is_not_taken_straight_back(small_box, reference):
    """b's long prompts make its counter the larger one while a holds more rows than its share: the row a
    preemption frees goes to b, and a's paused row waits (it does not pause and rejoin every step)."""
    engine, outbox = small_box
    a_team, b_team = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    flood = [submit(engine, f"Row {i}: far away", a_team, 150) for i in range(4)]
    outbox.wait_tokens(flood[-1])
    long_prompt = " ".join(["river"] * 120)
    b = [submit(engine, f"{i} {long_prompt}", b_team, 60) for i in range(2)]  # b's first one tied a's counter
    outbox.wait_all(flood + b)
    preempted = REGISTRY.get_sample_value("inference_team_preemptions_total", {"team": a_team}) or 0
    assert preempted <= 3, f"a's rows were paused {preempted:.0f} times for b's two requests"
    assert max(outbox.done_at(reply) for reply in b) < max(outbox.done_at(reply) for reply in flood)
    for reply, i in zip(b, range(2)):
        prompt = f"{i} {long_prompt}"
        assert outbox.tokens(reply) == reference.greedy(reference.encode(prompt), 60, min_new_tokens=60)

def test_interactive_work_pauses_batch_work_which_then_finishes_unchanged(small_box, reference):
    engine, outbox = small_box
    batch_prompts = [f"Batch line {i} says" for i in range(4)]
    batch = [submit(engine, p, "research", 200, "batch") for p in batch_prompts]
    outbox.wait_tokens(batch[0])
    started = time.monotonic()
    chat = submit(engine, "Hello there", "product", 6)
    outbox.wait_all(batch + [chat])
    assert outbox.tokens(chat) == reference.greedy(reference.encode("Hello there"), 6, min_new_tokens=6)
    assert outbox.done_at(chat) < min(outbox.done_at(r) for r in batch)  # it did not wait for a free slot
    assert outbox.first_token_at(chat) - started < 5.0
    for prompt, reply in zip(batch_prompts, batch):
        assert outbox.tokens(reply) == reference.greedy(reference.encode(prompt), 200, min_new_tokens=200)


def test_a_newcomers_first_token_comes_before_the_next_decode_step_of_a_full_box(small_box, reference):
    """b arrives while the flood decodes: its prefill runs in the first step that starts after it arrived, so
    the flood row it is measured against gets at most one more token first (the step under way when b came).
    Messages go out from the output thread, which may trail the engine: what counts is how many tokens the
    engine had decided for that row when b arrived."""
    engine, outbox = small_box
    flood_prompts = [f"Wave {i}: it was a dark night" for i in range(6)]
    flood = [submit(engine, p, "a", 120, stream=True) for p in flood_prompts]
    outbox.wait_tokens(flood[0])
    sent: dict[str, object] = {}

    def decided(channel: str) -> int:
        """Tokens the engine has decided for the channel's (one) choice so far."""
        return next(len(seq.completion_ids) for seq in engine.scheduler.in_flight()
                    if seq.request.reply_channel == channel)

    def arrive(channel: str, message: dict) -> None:
        if channel == flood[0] and message["type"] == protocol.DELTA and "b" not in sent:
            sent["decided"] = decided(flood[0])  # read before b exists: the step under way may add one
            sent["b"] = submit(engine, "A quick one", "b", 6, stream=True)

    outbox.hook = arrive
    try:
        b = _wait_for(sent)
        outbox.wait_all(flood + [b])
    finally:
        outbox.hook = None
    first_b = outbox.order.index(b)
    before_b = sum(count for channel, count in zip(outbox.order[:first_b], outbox.counts) if channel == flood[0])
    assert before_b <= sent["decided"] + 1, "b's prefill waited for a decode step"
    assert outbox.tokens(b) == reference.greedy(reference.encode("A quick one"), 6, min_new_tokens=6)
    for prompt, reply in zip(flood_prompts, flood):
        assert outbox.tokens(reply) == reference.greedy(reference.encode(prompt), 120, min_new_tokens=120)


def _wait_for(sent: dict, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while sent.get("b") is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return sent["b"]


@pytest.fixture(scope="module")
def one_batch_row_box(hf_cache):
    """4 slots, and batch work holds at most one row while interactive work is here."""
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=4, batch_rows_beside_interactive=1)) as engine:
        yield engine, outbox


@pytest.fixture(scope="module")
def cpu_default_box(hf_cache):
    """4 slots, batch rows beside interactive work left to the device: on CPU, none."""
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=4)) as engine:
        assert engine.config.batch_rows_beside_interactive == 0
        yield engine, outbox


@pytest.mark.parametrize("box, limit", [("one_batch_row_box", 1), ("cpu_default_box", 0)])
def test_batch_rows_beyond_the_limit_pause_while_interactive_work_runs(box, limit, request, reference):
    """No more than the limit's batch rows decode (nor batch prompts prefill) between an interactive
    answer's first and last tokens, and every paused row resumes where it stopped."""
    engine, outbox = request.getfixturevalue(box)
    batch_prompts = [f"Nightly job {i} reads" for i in range(5)]
    batch = [submit(engine, p, "research", 150, "batch", stream=True) for p in batch_prompts]
    outbox.wait_tokens(batch[3])  # four rows running, one waiting
    chat = submit(engine, "Hello again", "product", 12, stream=True)
    outbox.wait_tokens(chat)
    outbox.wait_all([chat])
    first = outbox.order.index(chat)
    last = len(outbox.order) - 1 - outbox.order[::-1].index(chat)
    beside = {channel for channel in outbox.order[first:last] if channel in batch}
    assert len(beside) <= limit, f"{len(beside)} batch rows decoded beside the interactive one"
    outbox.wait_all(batch)
    assert outbox.tokens(chat) == reference.greedy(reference.encode("Hello again"), 12, min_new_tokens=12)
    for prompt, reply in zip(batch_prompts, batch):  # paused rows resumed where they stopped
        assert outbox.tokens(reply) == reference.greedy(reference.encode(prompt), 150, min_new_tokens=150)


def test_batch_work_keeps_moving_beside_a_steady_interactive_stream(one_batch_row_box, reference):
    """Held to one row beside interactive work, batch lines still start one after another (their prompts
    prefill when no batch row decodes): they finish long before a long interactive answer does."""
    engine, outbox = one_batch_row_box
    chat = submit(engine, "Tell me everything", "product", 300, stream=True)
    outbox.wait_tokens(chat)
    batch = [submit(engine, f"Nightly line {i} says", "research", 8, "batch") for i in range(4)]
    outbox.wait_all(batch)
    assert not outbox.done(chat), "the batch lines waited for the interactive answer to end"
    for reply, prompt in zip(batch, [f"Nightly line {i} says" for i in range(4)]):
        assert outbox.tokens(reply) == reference.greedy(reference.encode(prompt), 8, min_new_tokens=8)
    outbox.wait_all([chat])
