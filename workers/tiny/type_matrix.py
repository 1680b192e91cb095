"""Issue 46's generated matrix: a tiny config for every causal-LM `model_type` the installed
transformers ships, so a new transformers release adds its new types by itself.

Why generated: the families suite (workers/tiny/families.py) is a hand-picked list; the
matrix shrinks each config class's own defaults instead (size fields capped, layers cut
to a few, a text/vision/audio section shrunk by the same rules, sizes a config leaves unset
filled) with a small table of per-type fix-ups. The checks over it: bench/types.py, run by
tests/test_type_matrix.py.
"""
from __future__ import annotations

import functools
from typing import Any

# size-like config fields -> the cap each gets in a tiny build (only fields the config has)
_CAPS: dict[str, int] = {
    "hidden_size": 64, "d_model": 64, "emb_dim": 64, "n_embd": 64, "dim": 64, "embed_dim": 64,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "d_ff": 128, "ffn_hidden_size": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "decoder_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "decoder_ffn_dim": 128,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "num_experts_per_token": 2, "n_group": 1, "num_expert_group": 1, "topk_group": 1,
    "hidden_size_per_layer_input": 16, "laurel_rank": 8, "moe_topk": 2, "shared_intermediate_size": 32,
    "expert_ffn_hidden_size": 32, "zero_expert_num": 2, "linear_num_heads": 4, "linear_head_dim": 16,
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "index_n_heads": 4, "index_head_dim": 16,
    "adapter_in_dim": 64, "adapter_out_dim": 64, "adapter_input_size": 64, "hidden_size_global": 64,
    "encoder_hash_byte_group_vocab": 512,
}

# fields a config leaves unset (None) that its model reads as numbers: set as the caps above set the others
_WHEN_UNSET: dict[str, int] = {"head_dim": 16, "num_key_value_heads": 2, "num_experts_per_tok": 2,
                               "n_routed_experts": 4, "num_local_experts": 4, "num_experts": 4,
                               "n_shared_experts": 1, "n_group": 1, "topk_group": 1}

# per-type fix-ups over the shrunk defaults (fields whose defaults don't shrink consistently)
FIXUPS: dict[str, dict[str, Any]] = {
    "gemma3n_text": dict(  # the last layers reuse the cache of the last sliding and full ones before them
        num_hidden_layers=6, num_kv_shared_layers=2, intermediate_size=[128] * 6,
        activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"]),
    "dbrx": dict(attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}),  # as real configs have
    "granitemoehybrid": dict(  # all Mamba by default
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2),
    "falcon_h1": dict(mamba_d_ssm=64),  # its Mamba width: heads × head dim
    "reformer": dict(axial_pos_embds_dim=[32, 32], attention_head_size=16, feed_forward_size=128),
    "qwen4_exp_text": dict(  # its indexer's sizes have no defaults; its n-gram embeddings' vocabulary is 20M
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=64, indexer_compress_ratio=4,
        ngram_vocab_size_base=512, ple_embed_dim=64, hc_lowrank=16, split_ngram_parts=4),
    "recurrent_gemma": dict(num_hidden_layers=3),  # its block types cycle recurrent, recurrent, attention
    "dots3_note_text": dict(head_dim=24),  # its sliding layers: qk_nope_head_dim + qk_rope_head_dim
    "xlstm": dict(num_heads=4, qk_dim_factor=1.0),  # its step state is sized as if queries were values
    "xmod": dict(default_language="en_XX"),  # its adapters: one language, as set_default_language would
    "zamba": dict(num_hidden_layers=4, layers_block_type=["linear_attention", "hybrid"] * 2),  # the shared block twice
    "lfm2_moe": dict(num_hidden_layers=4, num_dense_layers=1,
                     layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "cohere_compass_text": dict(  # its default has no rotary embedding at all (each layer type names its own)
        num_hidden_layers=4, layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={kind: {"rope_type": "default", "rope_theta": 10000.0}
                         for kind in ("sliding_attention", "full_attention")}),
    "mamba2": dict(num_heads=8, head_dim=16, n_groups=1),  # hidden × expand = heads × head_dim
}


def causal_lm_types() -> list[str]:
    """Every `model_type` transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, vocab_size: int, special_ids: dict[str, int] | None = None) -> Any:
    """The type's config with its own defaults shrunk to a tiny model over `vocab_size` tokens: a type of the
    families suite takes that family's fields (checked by hand); the others are shrunk by rule."""
    from transformers import AutoConfig

    from workers.tiny.families import _BASE, FAMILIES

    family = next((fields for family_type, fields in FAMILIES.values() if family_type == model_type), None)
    if family is not None:
        fields = {key: value for key, value in {**_BASE, **family}.items() if value is not None}
        fields.pop("attn_implementation", None)
        fields.update(special_ids or {})
        return AutoConfig.for_model(model_type, vocab_size=vocab_size, **fields)
    defaults = AutoConfig.for_model(model_type).to_dict()
    fields = _shrunk(defaults, vocab_size, special_ids or {})
    fields.update(FIXUPS.get(model_type, {}))
    fields.update(special_ids or {})
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **fields)


def _shrunk(defaults: dict[str, Any], vocab_size: int, special_ids: dict[str, int]) -> dict[str, Any]:
    """The fields of one config (its defaults) that a tiny build changes; a sub-config (a text, vision or audio
    section) is shrunk by the same rules, and a text section gets the tokenizer's vocabulary and ids."""
    fields: dict[str, Any] = {key: min(value, cap) for key, cap in _CAPS.items()
                              if isinstance(value := defaults.get(key), int) and not isinstance(value, bool)}
    layers_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") if k in fields), None)
    original = defaults.get(layers_key) if layers_key else None
    per_layer = {key: value for key, value in defaults.items() if isinstance(value, list) and original
                 and len(value) == original}
    kinds = {key: value for key, value in per_layer.items() if all(isinstance(v, str) for v in value)}
    if per_layer and layers_key:  # layer_types and the like: every kind the model mixes kept, in 4 layers or more
        fields[layers_key] = layers = max([4] + [len(set(v)) for v in kinds.values()])
        for key, values in per_layer.items():
            fields[key] = (_keep_every_kind(values, layers) if key in kinds else
                           [min(v, _CAPS[key]) if key in _CAPS and isinstance(v, int) else v for v in values[:layers]])
    if "vocab_size_per_layer_input" in defaults:  # Gemma 3n's per-layer embeddings: over the same tokens
        fields["vocab_size_per_layer_input"] = vocab_size
    if isinstance(per_index := defaults.get("per_layer_config"), dict) and per_index and layers_key:
        fields["per_layer_config"] = {index: {**override, **_shrunk(override, vocab_size, special_ids)}
                                      for index, override in _per_layer_config(per_index, fields[layers_key]).items()}
    fields.update({key: value for key, value in _WHEN_UNSET.items() if key in defaults and defaults[key] is None})
    if "kv_lora_rank" in defaults:  # MLA: the latent and rotary widths must agree
        fields.update({k: v for k, v in _MLA.items() if k in defaults})
        if "qk_head_dim" in defaults:  # derived widths some MLA configs store
            fields.update(qk_head_dim=_MLA["qk_nope_head_dim"] + _MLA["qk_rope_head_dim"],
                          head_dim=_MLA["qk_rope_head_dim"])
    if isinstance(defaults.get("rotary_dim"), int):
        fields["rotary_dim"] = min(defaults["rotary_dim"], 8)
    if defaults.get("is_decoder") is False:  # BERT-style models are causal LMs only as decoders
        fields["is_decoder"] = True
    for key, section in defaults.items():
        if isinstance(section, dict) and "model_type" in section:
            changed = {**_shrunk(section, vocab_size, special_ids), **FIXUPS.get(section["model_type"], {})}
            if "vocab_size" in section and key in _TEXT_SECTIONS:
                changed.update(vocab_size=vocab_size, **special_ids)
            if changed:
                fields[key] = {**section, **changed}
    return fields


# the sections of a composite config that hold its language model (the tokenizer's vocabulary goes there)
_TEXT_SECTIONS = ("text_config", "language_config", "llm_config", "decoder_config", "global_config")


_MLA = dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1,
            topk_group=1, first_k_dense_replace=1, num_key_value_heads=4)


def _keep_every_kind(kinds: list[str], layers: int) -> list[str]:
    """The first `layers` entries of a per-layer list, with each kind it holds present at least once."""
    kept = list(kinds[:layers])
    missing = [kind for kind in dict.fromkeys(kinds) if kind not in kept]
    for index, kind in enumerate(missing):
        kept[layers - 1 - index] = kind
    return kept


def _per_layer_config(per_index: dict, layers: int) -> dict:
    """A config's overrides by layer index, for the first `layers` layers (one kept on the last layer if none
    falls within them, so the tiny model still mixes its kinds of layers)."""
    kept = {key: value for key, value in per_index.items() if int(key) < layers}
    return kept or {type(key)(layers - 1): value for key, value in list(per_index.items())[:1]}


@functools.cache
def _tokenizer():
    """The tiny models' tokenizer, trained once per process (the matrix builds ~190 models in one)."""
    from workers.tiny.builders import SIZES, train_tokenizer

    return train_tokenizer(SIZES["tiny"]["vocab_target"], 512)


def build_type_model(model_type: str, repo_id: str, cache_dir=None, seed: int = 0, **overrides: Any):
    """A tiny random-weight model of `model_type` (its config's defaults shrunk) with the project's tokenizer,
    stored in the Hugging Face cache layout as `repo_id` (`overrides`: config fields set over the shrunk ones);
    returns the snapshot directory."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from workers.tiny.builders import BOS, EOS, PAD, _save_and_install

    tokenizer = _tokenizer()
    ids = dict(zip(("bos_token_id", "eos_token_id", "pad_token_id"),
                   (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))))
    config = tiny_config(model_type, len(tokenizer), {**ids, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(**ids)
    return _save_and_install(model, tokenizer, cache_dir, repo_id)
