"""What a forward costs by the tokens it computes, so the width choice (rows.py) weighs drafts against the time
they add on this device and this model.

A verifying step computes every row at every column: rows x columns positions. The time that adds is far
from proportional: on CPU a forward of 16 positions took 2.0x one of 1 and one of 33 only 2.4x (SmolLM2-135M,
2 cores: the weights are read once per forward, and the matrix kernels run some widths much better than
others), while on a GPU it stays flat to hundreds. So the curve is measured on the loaded model when
speculation is on (a few forwards at load, at most 1,024 positions and about a second of them) and read by
interpolation, straight on past the last point; where no two points could be measured, a guess of a fixed and
a per-position part.
"""
from __future__ import annotations

import bisect
import logging
import time

import torch

logger = logging.getLogger(__name__)

# The guess: a step's time as FIXED_POSITIONS[device] + positions, in one position's time (half fixed at 4
# positions on CPU, at 256 on a GPU, which stays weight-bound to far more rows).
FIXED_POSITIONS = {"cpu": 4, "cuda": 256}
MEASURING_S = 1.0  # the measuring stops (and the curve runs straight on) once it took this long: it holds the
# engine thread, between steps, once per load
MEASURED_POSITIONS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


class StepCost:
    """A forward's time (seconds, or any unit) by its positions: piecewise linear between measured points,
    straight on past the last two."""

    def __init__(self, points: dict[int, float], measured: bool) -> None:
        self.positions = sorted(points)
        self.times = [points[p] for p in self.positions]
        self.measured = measured

    @classmethod
    def guess(cls, device_type: str) -> "StepCost":
        fixed = FIXED_POSITIONS.get(device_type, FIXED_POSITIONS["cuda"])
        return cls({1: fixed + 1.0, 2: fixed + 2.0}, measured=False)

    def __call__(self, positions: int) -> float:
        points, times = self.positions, self.times
        at = bisect.bisect_left(points, positions)
        if at < len(points) and points[at] == positions:
            return times[at]
        if at == 0:
            return times[0]
        low = min(at, len(points) - 1) - 1  # between low and low + 1, or past the end along the last segment
        slope = max(0.0, (times[low + 1] - times[low]) / (points[low + 1] - points[low]))
        return times[low] + slope * (positions - points[low])

    def describe(self) -> str:
        if not self.measured:
            return "a guessed step cost"
        shown = [p for p in self.positions if p in (1, 16, 64, 256, 1024)] or self.positions[:1]
        return "step cost measured: " + ", ".join(f"{p} positions {self(p) * 1000:.1f} ms" for p in shown)


@torch.no_grad()
def measure_step_cost(model, device: torch.device, most_positions: int) -> StepCost:
    """Times forwards of 1..`most_positions` positions (one row, no cache: the weights' and the kernels' share,
    which is what a verifying step's extra columns add) on the loaded model. A forward that fails (out of memory
    on a large one) ends the measuring with the points it has; the guess where fewer than two."""
    points: dict[int, float] = {}
    started_all = time.perf_counter()
    wanted = [p for p in MEASURED_POSITIONS if p < most_positions]
    if most_positions <= MEASURED_POSITIONS[-1]:
        wanted.append(most_positions)
    try:
        for positions in wanted:
            ids = torch.zeros((1, positions), dtype=torch.long, device=device)
            best = float("inf")
            for _ in range(2):  # the first also warms the kernels of this shape
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
                model(input_ids=ids, use_cache=False)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                best = min(best, time.perf_counter() - started)
            points[positions] = best
            if time.perf_counter() - started_all > MEASURING_S:
                break
    except Exception as exc:  # a model that cannot run this plain forward, or not this wide
        logger.info("speculative decoding: timing the model's forwards stopped after %s positions (%s)",
                    max(points, default=0), exc)
    if len(points) < 2:
        return StepCost.guess(device.type)
    return StepCost(points, measured=True)
