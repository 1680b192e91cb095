"""Who goes next when the box is full: fair share between teams, and interactive work before batch work.

Each team has a virtual token counter (the Virtual Token Counter of Sheng et al., "Fairness in Serving
Large Language Models", OSDI '24): the service it received, in weighted tokens (a prompt token counts
PREFILL_WEIGHT, a generated one DECODE_WEIGHT) divided by its `share`. The next sequence to start comes
from the waiting team with the smallest counter, so a team's backlog never blocks another's; a team
that was idle rejoins at the smallest counter of the active ones (it cannot bank credit while away).
`batch` sequences start only when no `interactive` one waits. When only one team is active it gets
the whole box. `FairQueue` also decides preemption: which running sequences should give their slot
to a waiting one (a batch row for any interactive newcomer; a row of a team above its share of the
slots for a team below it).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator, Mapping
from typing import Protocol

PREFILL_WEIGHT = 1.0  # as in VTC: a generated token costs the box more than a prompt token
DECODE_WEIGHT = 2.0
CLASSES = ("interactive", "batch")  # in the order they are served


class Queued(Protocol):
    """What the queue needs of a sequence (workers.engine.sequences.Sequence)."""

    finished: bool
    team: str
    share: float
    priority_class: str


class FairQueue:
    """The waiting sequences, one FIFO per (class, team), and every team's counter."""

    def __init__(self) -> None:
        self._queues: dict[tuple[str, str], deque] = {}
        self.counters: dict[str, float] = {}  # team -> weighted tokens served / share

    # --- the waiting line ----------------------------------------------------------
    def extend(self, sequences, running: list[Queued] = ()) -> None:
        """Newcomers, at the back of their team's line."""
        for seq in sequences:
            self._arrive(seq, running)
            self._queues.setdefault((seq.priority_class, seq.team), deque()).append(seq)

    def clear(self) -> None:
        """Every waiting sequence dropped (the engine failed them all); counters kept."""
        self._queues.clear()

    def put_back(self, seq: Queued) -> None:
        """A paused sequence: at the front of its team's line (it goes on first when its team's turn comes)."""
        self._queues.setdefault((seq.priority_class, seq.team), deque()).appendleft(seq)

    def __iter__(self) -> Iterator[Queued]:
        for line in self._queues.values():
            yield from (seq for seq in line if not seq.finished)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return any(True for _ in self)

    def has_waiting(self, klass: str) -> bool:
        """Whether any sequence of the class waits."""
        return any(self._trim(line) for (k, _), line in self._queues.items() if k == klass)

    def peek(self, held: Mapping[str, int] | None = None, passed_over: Collection[tuple[str, str]] = ()) -> Queued | None:
        """The sequence that starts next: the first class with anyone waiting, its least-served team; on
        equal counters (a team rejoins at the least active one), the team holding fewer rows (`held`, by
        team), so a newcomer takes the slot a preemption freed for it, not the flooding team it tied with.
        The lines in `passed_over` ((class, team): those a preemption just took a row from) wait: the freed
        slot is not theirs."""
        held = held or {}
        for klass in CLASSES:
            lines = [(self.counters.get(team, 0.0), held.get(team, 0), team, line)
                     for (k, team), line in self._queues.items()
                     if k == klass and (k, team) not in passed_over and self._trim(line)]
            if lines:
                return min(lines, key=lambda item: item[:3])[3][0]
        return None

    def pop(self, held: Mapping[str, int] | None = None, passed_over: Collection[tuple[str, str]] = ()) -> Queued | None:
        seq = self.peek(held, passed_over)
        if seq is not None:
            self._queues[(seq.priority_class, seq.team)].popleft()
        return seq

    @staticmethod
    def _trim(line: deque) -> bool:
        while line and line[0].finished:  # cancelled while waiting
            line.popleft()
        return bool(line)

    # --- counters ------------------------------------------------------------------
    def _arrive(self, seq: Queued, running: list[Queued]) -> None:
        """A team with nothing waiting or running rejoins at the least counter of the active teams."""
        active = {s.team for s in running if not s.finished} | {team for (_, team), line in self._queues.items() if self._trim(line)}
        if seq.team in active:
            return
        floor = min((self.counters.get(team, 0.0) for team in active), default=None)
        if floor is not None:
            self.counters[seq.team] = max(self.counters.get(seq.team, 0.0), floor)
        else:
            self.counters.setdefault(seq.team, 0.0)

    def charge_teams(self, teams: list[tuple[str, int, float]]) -> None:
        """One generated token for each row a team holds: (team, rows, share) per team."""
        for team, count, share in teams:
            self.counters[team] = self.counters.get(team, 0.0) + DECODE_WEIGHT * count / max(share, 1e-6)

    def charge(self, seq: Queued, prompt_tokens: int = 0, generated: int = 0) -> None:
        self.counters[seq.team] = self.counters.get(seq.team, 0.0) + (
            PREFILL_WEIGHT * prompt_tokens + DECODE_WEIGHT * generated) / max(seq.share, 1e-6)

    # --- preemption ----------------------------------------------------------------
    def to_preempt(self, running: list[Queued], slots: int) -> list[Queued]:
        """Running sequences to pause now so that waiting ones get the slots they are owed.

        Every waiting interactive sequence may take a batch row's slot. Within a class, a waiting team
        holding fewer rows than its share of the slots (slots x share / the active teams' shares) takes a
        row from the team furthest above its own share (its most recently started row). Only as many as
        the slots the waiting teams are owed, so a team alone keeps the whole box.
        """
        free = slots - len(running)
        chosen: list[Queued] = []
        left = [s for s in running]
        waiting_interactive = sum(1 for seq in self if seq.priority_class == "interactive")
        batch_rows = [s for s in left if s.priority_class == "batch"]
        for _ in range(max(0, waiting_interactive - free)):
            if not batch_rows:
                break
            victim = batch_rows.pop()
            chosen.append(victim)
            left.remove(victim)
        free = max(0, free - waiting_interactive) + len(chosen)
        for klass in CLASSES:
            waiting_teams = {seq.team: seq.share for seq in self if seq.priority_class == klass}
            rows = [s for s in left if s.priority_class == klass]
            if not waiting_teams or not rows or free > 0:
                continue
            shares = {s.team: s.share for s in rows} | waiting_teams
            total = sum(shares.values())
            held = {team: sum(1 for s in rows if s.team == team) for team in shares}
            owed = {team: slots * share / total for team, share in shares.items()}
            for team in sorted(waiting_teams, key=lambda t: held[t] / owed[t]):
                if held[team] + 1 > owed[team] + 0.5:
                    continue  # at (or near) its share already: it waits its turn
                richest = max((t for t in held if held[t] > 0 and t != team), key=lambda t: held[t] / owed[t], default=None)
                if richest is None or held[richest] - 1 < owed[richest] - 0.5:
                    continue
                victim = [s for s in rows if s.team == richest][-1]
                rows.remove(victim)
                chosen.append(victim)
                held[richest] -= 1
                held[team] += 1
        return chosen
