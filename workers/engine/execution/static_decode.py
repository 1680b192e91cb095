"""A decode step as one static program: fixed shapes per bucket of rows, captured once into a CUDA graph.

A step over the window (workers/engine/execution/kv/slab.py, `decode_inputs`) has shapes that change every step
(the window grows by a column, rows join and leave), so the model's forward is dozens of small kernel
launches from Python at every step: on a GPU with a small model, the host is the bound (GPU busy 6-14 %
measured on an H100). Here a step runs a bucket of rows (1, 2, 4 … 256, the smallest that holds the
batch; the rest attend to their own new column and are dropped) over every column of the cache buffers,
with each kind's mask prepared in persistent tensors and the write position in a device tensor
(`SlabKV.static_inputs`): the same shapes and the same tensors at every step of a bucket, so on CUDA the
forward is captured once per bucket into a CUDA graph and replayed, one launch a step. The capture is
redone only when the buffers are reallocated (they grow by half, so rarely).

The first static step of a model is checked: the step runs over the window (its output is the one kept)
and again as the static program from the same states, and the static form is used only if both gave the
same logits (within float rounding); it is the step a CPU test runs eagerly, so every path but the capture
itself is proven without a GPU. Where a capture fails (a model whose forward syncs with the host, as
MoE routing does, or too little memory), that bucket runs the same program eagerly: logged once, never
an error to a client.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from workers.engine.execution.kv.slab import SlabKV

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WARMUP_RUNS = 2  # eager runs on a side stream before a capture (lazy inits, cuBLAS workspaces)

Forward = Callable[..., torch.Tensor]  # model kwargs -> last-position logits [rows, vocab]


def bucket_for(rows: int) -> int | None:
    return next((bucket for bucket in BUCKETS if bucket >= rows), None)


class StaticDecode:
    """One model's static decode steps: verified once, then eager or captured and replayed per bucket."""

    def __init__(self, slab: SlabKV, forward: Forward, name: str, cuda_graphs: bool) -> None:
        self.slab = slab
        self.forward = forward
        self.name = name
        self.cuda_graphs = cuda_graphs and slab.device.type == "cuda"
        self.verified: bool | None = None  # None: not yet checked against a step over the window
        self.graphs: dict[tuple[int, int], CapturedStep] = {}  # (bucket, generation of buffers)
        self.eager_buckets: set[int] = set()  # capture failed: the same program, eagerly
        self.steps = 0  # static steps run (the check's first step is not one)
        self.pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None

    def serves(self, rows: int) -> bool:
        return self.verified is not False and bucket_for(rows) is not None

    def step(self, last_tokens: list[int], over_window: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The logits [rows, vocab] of one decode step (the first one also runs `over_window`, the step
        over the window, and keeps its logits)."""
        if self.verified is None:
            return self._verify(last_tokens, over_window)
        bucket = bucket_for(self.slab.rows)
        self.steps += 1
        try:
            inputs = self.slab.static_inputs(last_tokens, bucket)
            if not self.cuda_graphs or bucket in self.eager_buckets:
                return self.forward(**inputs)[:self.slab.rows]
            return self._captured(bucket, inputs).replay()[:self.slab.rows]
        finally:
            self.slab.bucket = None

    def _captured(self, bucket: int, inputs: dict) -> CapturedStep:
        key = (bucket, self.slab.generation)
        step = self.graphs.get(key)
        if step is None:
            self.graphs = {k: g for k, g in self.graphs.items() if k[1] == self.slab.generation}
            states = self.slab.snapshot_states()  # the warm-up runs must not advance recurrent states
            try:
                step = self.graphs[key] = CapturedStep(self.forward, inputs, self.pool)
                logger.info("%s: decode step of %d rows captured into a CUDA graph", self.name, bucket)
            except Exception as exc:
                logger.warning("%s: a decode step of %d rows could not be captured (%s); it runs eagerly",
                               self.name, bucket, exc)
                self.eager_buckets.add(bucket)
                return EagerStep(self.forward, inputs)
            finally:
                self.slab.restore_states(states)
        return step

    def _verify(self, last_tokens: list[int], over_window: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run the static program, then the step over the window from the same states (kept: it writes
        the step's column again, over what a wrong static program may have written); use the static form
        from now on only if their logits agree."""
        states = self.slab.snapshot_states()
        try:
            inputs = self.slab.static_inputs(last_tokens, bucket_for(self.slab.rows))
            static = self.forward(**inputs)[:self.slab.rows].clone()
            why_not = None
        except Exception as exc:
            static, why_not = None, f"it failed: {type(exc).__name__}: {exc}"
        finally:
            self.slab.bucket = None
            self.slab.restore_states(states)
        kept = over_window()
        why_not = why_not or _difference(kept, static)
        self.verified = why_not is None
        logger.info("%s: decode steps %s", self.name, "run as one static program" + (
            ", captured per bucket into CUDA graphs" if self.cuda_graphs else "") if self.verified
            else f"stay over the window (the static program: {why_not})")
        return kept


def _difference(expected: torch.Tensor, got: torch.Tensor) -> str | None:
    """Why two steps' logits are not the same step's (None: they are, within float rounding)."""
    full_precision = expected.dtype in (torch.float32, torch.float64)
    expected, got = expected.float(), got.float()
    if not torch.isfinite(got).all():
        return "it gave non-finite logits"
    tolerance = (1e-4 if full_precision else 2e-2) * max(1.0, float(expected.abs().max()))
    gap = float((expected - got).abs().max())
    return None if gap <= tolerance else f"its logits differ by {gap:.3g}"


class EagerStep:
    def __init__(self, forward: Forward, inputs: dict) -> None:
        self.forward, self.inputs = forward, inputs

    def replay(self) -> torch.Tensor:
        return self.forward(**self.inputs)


class CapturedStep:
    """One bucket's step captured into a CUDA graph on its persistent inputs; `replay` reruns it on what
    they hold now and returns the graph's own output tensor (read it before the next replay)."""

    def __init__(self, forward: Forward, inputs: dict, pool) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):  # each run writes the same column with the same keys/values
                forward(**inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = forward(**inputs)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output
