"""Start of issue 46's generated matrix: a tiny config for every causal-LM `model_type`
the installed transformers ships, so a new transformers release adds its new types by itself.

Why generated: the families suite (workers/tiny/families.py) is a hand-picked list; the
matrix shrinks each config class's own defaults instead (size fields capped, layers cut
to a few) with a small table of per-type fix-ups. Only the builder is here so far: the
server-vs-`generate` checks over it and the engine's per-type declines are not done yet.
"""
from __future__ import annotations

from typing import Any

# size-like config fields -> the cap each gets in a tiny build (only fields the config has)
_CAPS: dict[str, int] = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "dim": 64, "embed_dim": 64,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "d_ff": 128, "ffn_hidden_size": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "decoder_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "decoder_ffn_dim": 128,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
}

# per-type fix-ups over the shrunk defaults (fields whose defaults don't shrink consistently)
FIXUPS: dict[str, dict[str, Any]] = {}


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
    fields = {key: min(value, cap) for key, cap in _CAPS.items()
              if isinstance(value := defaults.get(key), int) and not isinstance(value, bool)}
    layers_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") if k in fields), None)
    original = defaults.get(layers_key) if layers_key else None
    per_layer = {key: value for key, value in defaults.items() if isinstance(value, list) and original
                 and len(value) == original and all(isinstance(v, str) for v in value)}
    if per_layer and layers_key:  # layer_types and the like: every kind the model mixes kept, in 4 layers
        fields[layers_key] = layers = max(4, max(len(set(v)) for v in per_layer.values()))
        for key, kinds in per_layer.items():
            fields[key] = _keep_every_kind(kinds, layers)
    if "kv_lora_rank" in defaults:  # MLA: the latent and rotary widths must agree
        fields.update({k: v for k, v in _MLA.items() if k in defaults})
    if isinstance(defaults.get("rotary_dim"), int):
        fields["rotary_dim"] = min(defaults["rotary_dim"], 8)
    if defaults.get("is_decoder") is False:  # BERT-style models are causal LMs only as decoders
        fields["is_decoder"] = True
    fields.update(FIXUPS.get(model_type, {}))
    fields.update(special_ids or {})
    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **fields)


_MLA = dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_group=1,
            topk_group=1, first_k_dense_replace=1, num_key_value_heads=4)


def _keep_every_kind(kinds: list[str], layers: int) -> list[str]:
    """The first `layers` entries of a per-layer list, with each kind it holds present at least once."""
    kept = list(kinds[:layers])
    missing = [kind for kind in dict.fromkeys(kinds) if kind not in kept]
    for index, kind in enumerate(missing):
        kept[layers - 1 - index] = kind
    return kept


def build_type_model(model_type: str, repo_id: str, cache_dir=None, seed: int = 0, **overrides: Any):
    """A tiny random-weight model of `model_type` (its config's defaults shrunk) with the project's tokenizer,
    stored in the Hugging Face cache layout as `repo_id` (`overrides`: config fields set over the shrunk ones);
    returns the snapshot directory."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from workers.tiny.builders import BOS, EOS, PAD, SIZES, _save_and_install, train_tokenizer

    tokenizer = train_tokenizer(SIZES["tiny"]["vocab_target"], 512)
    ids = dict(zip(("bos_token_id", "eos_token_id", "pad_token_id"),
                   (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))))
    config = tiny_config(model_type, len(tokenizer), {**ids, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(**ids)
    return _save_and_install(model, tokenizer, cache_dir, repo_id)
