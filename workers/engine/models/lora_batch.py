"""Every adapter's LoRA term of a mixed batch in two matmuls per layer, not a gather and scatter per adapter.

peft's mixed-adapter forward (`adapter_names`) loops, in every LoRA layer, over the adapters present:
Python index lists, a gather of the adapter's rows, two small matmuls and a scatter back. With 8 adapters
over a 7-layer model that is hundreds of small ops per step, and it made a mixed batch step ~8× the base's
on CPU. Here each layer's adapters are stacked once (A: [sum of ranks, in], B: [out, sum of ranks]); a
step computes `x @ A.T` for every row, keeps each row's own adapter's block (a 0/1 mask; the base's rows
keep none), multiplies by `B.T` and scales per row — the same terms as `lora_B(lora_A(x)) * scaling`, the
other adapters' blocks contributing exact zeros. The ranks are small, so computing every block for every
row costs less than the bookkeeping it replaces (punica's and S-LoRA's batched LoRA do the same on a GPU
with gathered kernels).

Vanilla LoRA on linear layers only: an adapter with a variant (DoRA, aLoRA), a LoRA bias or LoRA on an
embedding or convolution goes through peft's own mixed forward (`DenseLoRA.serves` says which).
"""
from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator

import torch


class _Stacked:
    """One layer's adapters stacked: their A and B, each one's columns and scaling.

    `layout` (each adapter's name, rank and scaling here) keys the per-step row masks, which layers of
    the same layout share; ranks and scalings may differ by layer (peft's rank and alpha patterns).
    """

    def __init__(self, layer, adapters: tuple[str, ...], generation: int) -> None:
        self.generation = generation
        self.layout = tuple((name, layer.lora_A[name].weight.shape[0], float(layer.scaling[name])) for name in adapters)
        self.a = torch.cat([layer.lora_A[name].weight for name in adapters], dim=0) if adapters else None
        self.b = torch.cat([layer.lora_B[name].weight for name in adapters], dim=1) if adapters else None
        self.blocks: dict[str, tuple[slice, float]] = {}
        start = 0
        for name, rank, scaling in self.layout:
            self.blocks[name] = (slice(start, start + rank), scaling)
            start += rank


class DenseLoRA:
    """Forward hooks on a PeftModel's LoRA linear layers that add the rows' adapter terms inside `rows()`.

    The layers are left with no active adapter (workers/engine/models/adapters.py), so outside `rows()` a forward
    is the base model's; inside, each layer adds what its rows' adapters contribute.
    """

    def __init__(self, peft_model: torch.nn.Module) -> None:
        self.peft_model = peft_model
        self._config_names: tuple[str, ...] = ()
        self.generation = 0  # bumped by changed(): every layer restacks its adapters on its next forward
        self._fresh = False
        self._names: list[str] | None = None  # the rows' adapters while inside rows()
        self._row_terms: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # per layout, this forward
        self._plain = True

    def _lora_layers(self):
        from peft.tuners.lora.layer import LoraLayer

        return [m for m in self.peft_model.modules() if isinstance(m, LoraLayer)]

    def changed(self) -> None:
        """An adapter was loaded or unloaded (workers/engine/models/adapters.py): restack before the next forward."""
        self._fresh = False

    def _refresh(self) -> None:
        """Hook new layers and re-check what is served after adapters were loaded or unloaded."""
        from peft.tuners.lora.layer import Linear

        if self._fresh:
            return
        self._fresh = True
        self.generation += 1
        self._config_names = tuple(self.peft_model.peft_config)
        layers = self._lora_layers()
        self._plain = all(
            isinstance(layer, Linear) and not layer.lora_variant
            and all(layer.lora_B[name].bias is None for name in layer.lora_B)
            for layer in layers)
        for layer in layers:
            if isinstance(layer, Linear) and not getattr(layer, "_dense_lora_hooked", False):
                layer.register_forward_hook(self._add_terms)
                layer._dense_lora_hooked = True

    def serves(self) -> bool:
        """Whether every loaded adapter is vanilla LoRA on linear layers (else peft's mixed forward)."""
        self._refresh()
        return self._plain

    @contextmanager
    def rows(self, names: list[str]) -> Iterator[None]:
        """Within: every LoRA layer adds, to row i, the term of adapter `names[i]` (none for the base's rows)."""
        self._names, self._row_terms = names, {}
        try:
            yield
        finally:
            self._names, self._row_terms = None, {}

    def _terms_for(self, stacked: _Stacked, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: the mask that keeps its adapter's block of `x @ A.T`, and its adapter's scaling."""
        terms = self._row_terms.get(stacked.layout)
        if terms is None:
            mask = torch.zeros(len(self._names), stacked.a.shape[0], dtype=like.dtype)
            scale = torch.zeros(len(self._names), dtype=torch.float32)  # a Python float's precision, as peft's
            for row, name in enumerate(self._names):
                if name in stacked.blocks:
                    block, scale[row] = stacked.blocks[name]
                    mask[row, block] = 1
            terms = (mask.to(like.device), scale.to(like.device))
            self._row_terms[stacked.layout] = terms
        return terms

    def _add_terms(self, layer, args, result: torch.Tensor):
        if self._names is None:
            return None
        stacked = getattr(layer, "_dense_lora", None)
        if stacked is None or stacked.generation != self.generation:
            adapters = tuple(name for name in layer.lora_A if name in self._config_names)
            stacked = layer._dense_lora = _Stacked(layer, adapters, self.generation)
        if stacked.a is None:  # every adapter of this layer was unloaded
            return None
        x = args[0].to(stacked.a.dtype)
        mask, scale = self._terms_for(stacked, x)
        lead = (x.shape[0],) + (1,) * (x.dim() - 2)  # one mask and scale per row, over its positions
        hidden = (x @ stacked.a.T) * mask.view(*lead, -1)
        term = (hidden @ stacked.b.T) * scale.view(*lead, 1)  # scaled in float32, rounded once, as peft's
        return result + term.to(result.dtype)


def dense_lora(peft_model: torch.nn.Module) -> DenseLoRA:
    """The PeftModel's DenseLoRA (made on first use; it lives as long as the PeftModel)."""
    found = getattr(peft_model, "_dense_lora_batch", None)
    if found is None:
        found = DenseLoRA(peft_model)
        peft_model._dense_lora_batch = found
    return found
