"""An embedding model's pooling, read from its sentence-transformers config (`modules.json`,
`1_Pooling/config.json`, `sentence_bert_config.json`), and applied to hidden states as
sentence-transformers' `Pooling` module does (workers/engine/tasks/embedding.py runs it); and a
cross-encoder's head (`read_classifier`: the activation on its logit, workers/engine/tasks/pair_scoring.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.engine.errors import ModelLoadError

POOLING_MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "lasttoken")  # ST's order
KNOWN_MODULES = {"Transformer", "Pooling", "Normalize"}


@dataclass(frozen=True)
class Pooling:
    """What turns the transformer's hidden states into one vector, as the repo's sentence-transformers config says."""

    modes: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None
    do_lower_case: bool
    dimension: int
    matryoshka: bool | tuple[int, ...] = False  # dimensions a request may ask for: any (True), these, or none

    def allows(self, dimensions: int) -> bool:
        if dimensions == self.dimension:
            return True
        if isinstance(self.matryoshka, tuple):
            return dimensions in self.matryoshka
        return bool(self.matryoshka) and 0 < dimensions < self.dimension


def read_pooling(snapshot: Path, config: dict) -> Pooling:
    """The pooling of a sentence-transformers snapshot (a folder holding `modules.json`)."""
    try:
        modules = json.loads((snapshot / "modules.json").read_text())
        pooling_path = None
        normalize = False
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind not in KNOWN_MODULES:
                raise ModelLoadError(f"The embedding model's module {module.get('type')!r} is not supported here "
                                     f"(only {', '.join(sorted(KNOWN_MODULES))}).")
            if kind == "Pooling":
                pooling_path = snapshot / module.get("path", "") / "config.json"
            normalize = normalize or kind == "Normalize"
        if pooling_path is None:
            raise ModelLoadError("The embedding model's modules.json has no Pooling module.")
        raw = json.loads(pooling_path.read_text())
        bert = snapshot / "sentence_bert_config.json"
        bert_config = json.loads(bert.read_text()) if bert.is_file() else {}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ModelLoadError(f"The embedding model's sentence-transformers config cannot be read: {exc}") from exc
    modes = tuple(mode for mode in POOLING_MODES if raw.get(f"pooling_mode_{mode}"))
    unknown = [key for key, on in raw.items() if key.startswith("pooling_mode_") and on
               and key[len("pooling_mode_"):] not in POOLING_MODES]
    if not modes or unknown:
        raise ModelLoadError(f"The embedding model's pooling ({', '.join(unknown) or 'none'}) is not supported here "
                             f"(one or more of {', '.join(POOLING_MODES)}).")
    dims = config.get("matryoshka_dimensions")
    matryoshka = tuple(int(d) for d in dims) if isinstance(dims, list) else bool(config.get("is_matryoshka"))
    max_len = bert_config.get("max_seq_length")
    return Pooling(modes=modes, normalize=normalize, max_seq_length=int(max_len) if max_len else None,
                   do_lower_case=bool(bert_config.get("do_lower_case")),
                   dimension=int(raw.get("word_embedding_dimension") or config.get("hidden_size")) * len(modes),
                   matryoshka=matryoshka)


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """sentence-transformers' Pooling over right-padded rows (`mask`: 1 for real tokens)."""
    mask_f = mask.unsqueeze(-1).to(hidden.dtype)
    lengths = mask.sum(dim=1)
    parts = []
    for mode in modes:
        if mode == "cls_token":
            parts.append(hidden[:, 0])
        elif mode == "max_tokens":
            parts.append(hidden.masked_fill(mask_f == 0, -1e9).max(dim=1).values)
        elif mode in ("mean_tokens", "mean_sqrt_len_tokens"):
            summed = (hidden * mask_f).sum(dim=1)
            count = mask_f.sum(dim=1).clamp(min=1e-9)
            parts.append(summed / count if mode == "mean_tokens" else summed / torch.sqrt(count))
        else:  # lasttoken
            parts.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1])
    return torch.cat(parts, dim=1)


# sentence-transformers' activation names (`sentence_transformers.activation_fn` in config.json, or its
# pre-4.0 `sbert_ce_default_activation_function`): whether each applies a sigmoid.
ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": True, "torch.nn.Sigmoid": True,
               "torch.nn.modules.linear.Identity": False, "torch.nn.Identity": False}


@dataclass(frozen=True)
class Classifier:
    """A cross-encoder's head, as its config says: the logit goes through a sigmoid or not."""

    sigmoid: bool


def read_classifier(config: dict) -> Classifier:
    """The head of a sequence-classification config (`AutoConfig.to_dict()`); one label only (one score)."""
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels") or 1)
    if labels != 1:
        raise ModelLoadError(f"This sequence-classification model has {labels} labels; only cross-encoders with "
                             "one label (one score per pair) are served here.")
    st_config = config.get("sentence_transformers")
    named = (st_config.get("activation_fn") if isinstance(st_config, dict) else None) \
        or config.get("sbert_ce_default_activation_function")
    if named is None:
        return Classifier(sigmoid=True)  # CrossEncoder's default for one label
    if named not in ACTIVATIONS:
        raise ModelLoadError(f"The cross-encoder's activation {named!r} is not supported here "
                             "(Sigmoid or Identity).")
    return Classifier(sigmoid=ACTIVATIONS[named])
