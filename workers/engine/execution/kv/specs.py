"""What a model caches, layer by layer, and what the engine may therefore do with it.

Every family keeps a different cache: full attention keeps every token's keys and
values; a sliding-window layer needs only the last `window - 1`; MLA keeps a latent
(keys) and a rotary part (values) of different widths; linear attention and Mamba
layers keep one fixed-size state per row (a convolution window and a recurrent
state), whatever the length. The spec is read off the model itself: the layer
classes transformers' own cache builds from its config, and the shapes of one
token's forward through it. Each kind has its own store in the running batch
(workers/engine/execution/kv/stores.py) and its own rules: a recurrent state cannot be cut
out of a padded batch, so models with one prefill every prompt alone, and reuse
another prompt's prefix only from a checkpoint of their states; and some recurrent layers only
continue a cached state one token at a time, so their prompts prefill whole (the
engine measures which at load, `continues_chunks`).
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionLayer

from workers.engine.errors import ModelLoadError
from workers.engine.execution.kv.recompute import recompute_problem

logger = logging.getLogger(__name__)

FULL, SLIDING, STATE, NONE, OTHER = "full", "sliding", "state", "none", "other"
# Relative difference between a prompt's last logits prefilled whole and in two chunks below which the
# model's recurrent layers continue their state across chunks (one that restarts differs by O(0.1-1));
# half precision rounds differently for the two (a chunk's sums in another order).
CHUNK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
CHUNK_TOLERANCE_HALF = 3e-2
# The same for a left-padded row against the row alone: in half precision a padded batch's kernels differ by
# up to ~1e-2 and a false "no" would decode every row alone, so only a model that misplaces its padded rows
# (O(0.5-1)) is caught there; float32 catches small misplacements too (GIT's: 1e-2).
PAD_TOLERANCE_HALF = 0.1


@dataclass(frozen=True)
class LayerSpec:
    kind: str  # FULL, SLIDING, STATE, NONE (no cache: shared KV, MLP-only), OTHER (a cache we cannot batch)
    window: int = 0  # SLIDING: the window, in tokens (the layer keeps the last window - 1)
    token_bytes: int = 0  # FULL/SLIDING: keys + values of one token
    row_bytes: int = 0  # STATE: the fixed state of one row
    latent: bool = False  # FULL: keys and values of different shapes (MLA's latent and rotary part)

    def bytes_for(self, tokens: int) -> int:
        if self.kind == SLIDING:
            return min(tokens, self.window) * self.token_bytes
        return tokens * self.token_bytes + self.row_bytes


@dataclass(frozen=True)
class CacheSpec:
    layers: tuple[LayerSpec, ...]
    cache_arg: str = "past_key_values"  # the forward's name for its cache (Mamba: cache_params)
    takes_positions: bool = True  # the forward takes position_ids (ALiBi and Mamba models do not)
    continues_chunks: bool = True  # a multi-token forward continues a cached state exactly
    pads_rows: bool = True  # a left-padded row gives the logits it gives alone (measured at load: `_padding_problem`)
    notes: tuple[str, ...] = field(default=())
    recomputes: bool = False  # no cache to continue: every token runs the whole text (kv/recompute.py)

    def has(self, kind: str) -> bool:
        return any(layer.kind == kind for layer in self.layers)

    @property
    def batchable(self) -> bool:
        """Rows decode together in one forward (every layer's cache has a batch store, and the model reads a
        left-padded row's positions as its own)."""
        return bool(self.layers) and not self.has(OTHER) and self.pads_rows

    @property
    def attends(self) -> bool:
        return self.has(FULL) or self.has(SLIDING)

    @property
    def reuses_prefixes(self) -> bool:
        """A prompt may start from the keys/values another prompt's prefix left; recurrent states from
        checkpoints (kv/prefix_cache.py), but not beside sliding layers, which a recurrent model's prefill
        keeps only the window of."""
        return self.batchable and not (self.has(STATE) and self.has(SLIDING))

    @property
    def prefills_padded(self) -> bool:
        """Prompts may prefill together in one left-padded forward and be cut apart after (a recurrent
        state cannot be cut out of a padded batch)."""
        return self.batchable and not self.has(STATE)

    def bytes_for(self, tokens: int) -> int:
        """Cache bytes of one sequence of `tokens` tokens."""
        return sum(layer.bytes_for(tokens) for layer in self.layers)

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for layer in self.layers:
            label = (f"{layer.kind}({layer.window})" if layer.kind == SLIDING
                     else "full (MLA)" if layer.latent else layer.kind)
            counts[label] = counts.get(label, 0) + 1
        return ", ".join(f"{n} {label}" for label, n in counts.items())


def _layer_kind(layer) -> str:
    if isinstance(layer, DummyLayer):
        return NONE
    if type(layer) is DynamicLayer:
        return FULL
    if type(layer) is DynamicSlidingWindowLayer:
        return SLIDING
    if type(layer) is LinearAttentionLayer:
        return STATE
    return OTHER


def _nbytes(tensor: torch.Tensor | None) -> int:
    """Bytes of a tensor holding one row (and, for keys/values, one token)."""
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def forward_arguments(model) -> tuple[str, bool]:
    """(the forward's name for its cache, whether it takes position_ids)."""
    parameters = inspect.signature(model.forward).parameters
    cache_arg = "past_key_values" if "past_key_values" in parameters or "cache_params" not in parameters else "cache_params"
    return cache_arg, "position_ids" in parameters


def cache_spec(model, device: torch.device) -> CacheSpec:
    """The model's cache, layer by layer, read off one token's forward through transformers' own cache
    for its config; for a model with recurrent layers, also whether they continue a state across chunks."""
    cache_arg, takes_positions = forward_arguments(model)
    config = model.config
    cache = DynamicCache(config=config)
    kinds = [_layer_kind(layer) for layer in cache.layers]
    if not kinds:  # a config transformers builds no layers for: decode row by row
        return CacheSpec((LayerSpec(OTHER),), cache_arg, takes_positions, notes=("no layer types in its config",))
    try:
        with torch.inference_mode():
            output = model(input_ids=torch.tensor([[_probe_token(model)]], device=device), use_cache=True,
                           logits_to_keep=1, **{cache_arg: cache})
    except Exception as exc:  # e.g. a model whose forward needs more than token ids: sizes unknown
        if getattr(model, "main_input_name", "input_ids") == "input_ids":  # (not Whisper: audio features first)
            why = _continues_problem(model, device, cache_arg, takes_positions)
            if why:  # a forward failing on ids alone
                return _recomputed(model, device, cache_arg, takes_positions, why)
        logger.warning("%s: could not read its cache's shapes (%s); sizing it from the config",
                       getattr(config, "name_or_path", ""), exc)
        return _spec_from_config(config, kinds, cache_arg, takes_positions)
    why = (_cache_problem(output, cache_arg, cache) or _continues_problem(model, device, cache_arg, takes_positions))
    if why:
        return _recomputed(model, device, cache_arg, takes_positions, why)
    layers = []
    for kind, layer in zip(kinds, cache.layers):
        if kind in (FULL, SLIDING) and layer.keys is None:  # a layer the config counts that the forward never
            layers.append(LayerSpec(NONE))  # filled (BART-style decoders: the encoder's layers)
        elif kind in (FULL, SLIDING):
            window = getattr(layer, "sliding_window", 0) if kind == SLIDING else 0
            layers.append(LayerSpec(kind, window, _nbytes(layer.keys) + _nbytes(layer.values),
                                    latent=layer.keys.shape != layer.values.shape))
        elif kind == STATE:
            state = sum(_nbytes(t) for t in (*layer.conv_states.values(), *layer.recurrent_states.values()))
            layers.append(LayerSpec(kind, row_bytes=state))
        else:
            layers.append(LayerSpec(kind))
    spec = CacheSpec(tuple(layers), cache_arg, takes_positions)
    padding = ("" if spec.has(STATE) or not spec.batchable
               else _padding_problem(model, device, cache_arg, takes_positions))
    # plain attention checked in full precision only: half precision's rounding would pass for a difference
    chunking = ("" if not (spec.has(STATE) or spec.has(OTHER) or padding or model.dtype in CHUNK_TOLERANCE)
                else _chunking_problem(model, device, cache_arg, spec.has(STATE)))
    notes = tuple(f"{why}: {what}" for why, what in ((padding, "rows decode one by one"),
                                                      (chunking, "prompts prefill whole")) if why)
    return CacheSpec(spec.layers, cache_arg, takes_positions, not chunking, not padding, notes)


def _cache_problem(output, cache_arg: str, cache) -> str:
    """Why the forward keeps nothing to continue from ("" when it does): no cache returned (RWKV's own state,
    XLM, OpenAI GPT), or one left empty."""
    returned = getattr(output, cache_arg, None) if cache_arg != "past_key_values" else None
    returned = returned if returned is not None else getattr(output, "past_key_values", None)
    filled = any(getattr(layer, "keys", None) is not None or getattr(layer, "conv_states", None)
                 or getattr(layer, "recurrent_states", None) for layer in cache.layers)
    if returned is None:
        return "its forward returns no cache"
    return "" if filled else "its forward leaves transformers' cache empty"


def _continues_problem(model, device: torch.device, cache_arg: str, takes_positions: bool) -> str:
    """Why the forward fails where the engine continues a prompt one token at a time with transformers' own
    cache (the path every model with a cache can take: row by row); "" when it does not."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (1, 11), generator=torch.Generator().manual_seed(2)).to(device)
    cache = DynamicCache(config=model.config)
    try:
        with torch.inference_mode():
            for start, end in ((0, 9), (9, 10), (10, 11)):
                positions = {"position_ids": torch.arange(start, end, device=device)[None]} if takes_positions else {}
                output = model(input_ids=ids[:, start:end], use_cache=True, logits_to_keep=1, **{cache_arg: cache},
                               **positions)
                returned = getattr(output, cache_arg, None) if cache_arg != "past_key_values" else None
                cache = returned if returned is not None else output.past_key_values
    except Exception as exc:
        return (f"its forward fails when a prompt is continued one token at a time with its cache "
                f"({type(exc).__name__}: {str(exc)[:160]})")
    return ""


def _recomputed(model, device: torch.device, cache_arg: str, takes_positions: bool, why: str) -> CacheSpec:
    """A model without a cache the engine can continue: served by recomputing the whole text each token, one
    row at a time, where that gives its own `generate`'s logits; else refused (ModelLoadError) with both whys."""
    unlike = recompute_problem(model, device, lambda got, want: _near(got, want, model.dtype))
    if unlike:
        name = getattr(model.config, "name_or_path", "") or model.config.model_type
        raise ModelLoadError(f"The model `{name}` cannot be served: {why}, and {unlike}.")
    return CacheSpec((LayerSpec(OTHER),), cache_arg, takes_positions, continues_chunks=False, recomputes=True,
                     notes=(f"{why}: every token recomputes the whole text, one row at a time",))


def _probe_token(model) -> int:
    vocab = model.config.get_text_config().vocab_size
    return min(5, vocab - 1)


def _near(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, half: float = CHUNK_TOLERANCE_HALF) -> bool:
    tolerance = CHUNK_TOLERANCE.get(dtype, half)
    return bool((got.float() - want.float()).norm() <= tolerance * want.float().norm())


def _padding_problem(model, device: torch.device, cache_arg: str, takes_positions: bool) -> str:
    """Why a row left-padded beside a longer one, prefilled and then decoding a token, does not give the logits
    it gives alone ("" when it does). Models whose forward counts positions from the cache's length (BART-style
    decoders, Marian, Pegasus, TrOCR, GIT…) do not: their padded rows would be decoded at the wrong positions."""
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(1)
    short, long = (torch.randint(3, vocab, (1, n), generator=generator).to(device) for n in (9, 15))
    following = torch.randint(3, vocab, (2, 1), generator=generator).to(device)

    def run(ids, mask, starts: list[int], last):
        cache = DynamicCache(config=model.config)
        positions = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if takes_positions else {}
        first = model(input_ids=ids, attention_mask=mask, use_cache=True, **{cache_arg: cache},
                      **positions).logits[:, -1]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = {"position_ids": torch.tensor(starts, device=device)[:, None]} if takes_positions else {}
        second = model(input_ids=last, attention_mask=mask, use_cache=True, **{cache_arg: cache},
                       **positions).logits[:, -1]
        return first, second

    try:
        with torch.inference_mode():
            padded = torch.cat([torch.cat([torch.zeros_like(short[:, :6]), short], dim=1), long])
            mask = torch.ones_like(padded)
            mask[0, :6] = 0
            together = run(padded, mask, [9, 15], following)
            for row, ids in enumerate((short, long)):
                alone = run(ids, torch.ones_like(ids), [ids.shape[1]], following[row:row + 1])
                if not all(_near(got[row], want[0], model.dtype, PAD_TOLERANCE_HALF)
                           for got, want in zip(together, alone)):
                    return ("a left-padded row's logits differ from its own alone (its positions count from the "
                            "cache's length, not the row's)")
    except Exception as exc:  # a forward that takes no padded batch
        return f"a left-padded batch failed in its forward ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


def _chunking_problem(model, device: torch.device, cache_arg: str, recurrent: bool) -> str:
    """Why a prompt prefilled in two chunks does not give the logits it gives whole ("" when it does): recurrent
    layers that only continue their state one token at a time restart it on a longer chunk; some caches of
    their own keep what a chunk cannot extend."""
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, 24), generator=generator).to(device)
    try:
        if _chunked_like_whole(model, device, cache_arg, ids):
            return ""
    except Exception as exc:  # a cache that cannot take a second chunk
        return f"a prompt's second chunk failed in its forward ({type(exc).__name__}: {str(exc)[:120]})"
    return ("its recurrent layers restart on a multi-token chunk" if recurrent
            else "a prompt's logits differ when prefilled in chunks")


def _chunked_like_whole(model, device: torch.device, cache_arg: str, ids: torch.Tensor) -> bool:
    with torch.inference_mode():
        whole = model(input_ids=ids, use_cache=True, logits_to_keep=1,
                      **{cache_arg: DynamicCache(config=model.config)}).logits[0, -1].float()
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :12], use_cache=True, logits_to_keep=1, **{cache_arg: cache})
        chunked = model(input_ids=ids[:, 12:], use_cache=True, logits_to_keep=1, **{cache_arg: cache},
                        **({"position_ids": torch.arange(12, 24, device=device)[None]}
                           if forward_arguments(model)[1] else {})).logits[0, -1].float()
    return _near(chunked, whole, model.dtype)


def _spec_from_config(config, kinds: list[str], cache_arg: str, takes_positions: bool) -> CacheSpec:
    """Sizes from the config when no forward could be run (plain attention layers assumed; a recurrent
    layer's state counted as nothing, and its chunks prefilled whole)."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    element = torch.finfo(getattr(text, "dtype", None) or torch.float32).bits // 8
    token = 2 * heads * head_dim * element
    window = getattr(text, "sliding_window", None) or 0
    layers = tuple(LayerSpec(kind, window if kind == SLIDING else 0, token if kind in (FULL, SLIDING) else 0)
                   for kind in kinds)
    return CacheSpec(layers, cache_arg, takes_positions, continues_chunks=STATE not in kinds)
