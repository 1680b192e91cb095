"""Tiny random causal LMs of every architecture family people serve, built offline.

Each family is one line: its `model_type` and the config fields that turn its
features on (sliding windows, alternating layer types, attention sinks, MLA,
linear attention, Mamba state, soft-capping, MoE). Hidden size 64 and a few
layers keep every model a few hundred KB; the sliding window is 16 tokens, so a
prompt of a few dozen tokens already runs past it. They share the project's
trained tokenizer (workers/tiny/builders.py) and are stored into a Hugging Face
cache layout, so the real loading code loads them. A new family joins by one line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

WINDOW = 16  # tokens in a sliding window: small, so tests run past it cheaply
CONTEXT = 2048

_BASE: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, max_position_embeddings=CONTEXT,
                             initializer_range=0.2, tie_word_embeddings=False)

# family name -> (model_type, config fields over _BASE). None drops a _BASE field the family's config lacks.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "qwen3-moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "olmo2": ("olmo2", {}),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=CONTEXT, hidden_size=None, intermediate_size=None,
                          num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None, head_dim=None,
                          max_position_embeddings=None)),
    "gpt-neox": ("gpt_neox", dict(num_key_value_heads=None, head_dim=None)),
    "opt": ("opt", dict(ffn_dim=128, word_embed_proj_dim=64, intermediate_size=None, num_key_value_heads=None,
                        head_dim=None)),
    "bloom": ("bloom", dict(n_layer=2, n_head=4, num_hidden_layers=None, num_attention_heads=None,
                            num_key_value_heads=None, head_dim=None, intermediate_size=None,
                            max_position_embeddings=None)),
    "falcon": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=2, num_key_value_heads=None, head_dim=None,
                              intermediate_size=None)),
    "falcon-alibi": ("falcon", dict(alibi=True, new_decoder_architecture=False, multi_query=True, parallel_attn=True,
                                    bias=False, num_key_value_heads=None, head_dim=None, intermediate_size=None)),
    "granite": ("granite", {}),
    "smollm3": ("smollm3", {}),
    "cohere": ("cohere", {}),
    # sliding windows: every layer, some layers, alternating
    "mistral": ("mistral", dict(sliding_window=WINDOW)),
    "phi3": ("phi3", dict(sliding_window=WINDOW, head_dim=None)),
    "cohere2": ("cohere2", dict(sliding_window=WINDOW, num_hidden_layers=4,
                                layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    "gemma3": ("gemma3_text", dict(sliding_window=WINDOW, num_hidden_layers=4, query_pre_attn_scalar=16,
                                   layer_types=["sliding_attention", "full_attention"] * 2)),
    "qwen2-sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, num_hidden_layers=4,
                                    max_window_layers=2)),
    "gemma2": ("gemma2", dict(sliding_window=WINDOW, num_hidden_layers=4, query_pre_attn_scalar=16,
                              final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                              attn_implementation="eager")),
    "gpt-oss": ("gpt_oss", dict(sliding_window=WINDOW, num_hidden_layers=4, num_local_experts=4,
                                num_experts_per_tok=2, intermediate_size=64, attn_implementation="eager")),
    # MLA: a latent of kv_lora_rank cached for keys, the rotary part for values
    "deepseek-v3": ("deepseek_v3", dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                        v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                        topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
                                        num_key_value_heads=4, head_dim=None)),
    # hybrids: linear attention or Mamba layers beside attention layers
    "qwen3.5": ("qwen3_5_text", dict(num_hidden_layers=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                     linear_num_key_heads=2, linear_num_value_heads=4,
                                     layer_types=["linear_attention", "full_attention"] * 2)),
    "qwen3-next": ("qwen3_next", dict(num_hidden_layers=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                      linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32,
                                      layer_types=["linear_attention", "full_attention"] * 2)),
    "jamba": ("jamba", dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                            expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8,
                            use_mamba_kernels=False, head_dim=None)),
    "bamba": ("bamba", dict(num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=4, mamba_d_head=32,
                            mamba_d_state=8, mamba_chunk_size=16, head_dim=None)),
    "mamba": ("mamba", dict(state_size=8, expand=2, conv_kernel=4, num_attention_heads=None,
                            num_key_value_heads=None, head_dim=None, max_position_embeddings=None,
                            intermediate_size=None)),
}


def family_config(family: str, tokenizer, overrides: dict[str, Any] | None = None) -> Any:
    """The family's config for a model over `tokenizer` (special tokens set from it); `overrides` over its own
    fields (a wider build for a benchmark)."""
    from transformers import AutoConfig

    from workers.tiny.builders import BOS, EOS, PAD

    model_type, own = FAMILIES[family]
    fields = {**_BASE, **own, **(overrides or {})}
    fields = {key: value for key, value in fields.items() if value is not None}
    attn = fields.pop("attn_implementation", None)
    bos, eos, pad = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos,
                                  pad_token_id=pad, **fields)
    if attn is not None:
        config._attn_implementation = attn
    return config


def build_tiny_families(families: list[str], cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Several families at once, as `local/tiny-<family>` (the tokenizer trained once)."""
    from workers.tiny.builders import SIZES, train_tokenizer

    tokenizer = train_tokenizer(SIZES["tiny"]["vocab_target"], CONTEXT)
    return [build_tiny_family(family, cache_dir=cache_dir, tokenizer=tokenizer) for family in families]


def build_tiny_family(family: str, repo_id: str | None = None, cache_dir: str | os.PathLike | None = None,
                      seed: int = 0, tokenizer=None, eos_token_ids: list[int] | None = None,
                      overrides: dict[str, Any] | None = None) -> Path:
    """Build the family's tiny model with the project's tokenizer into the cache as `repo_id`
    (default `local/tiny-<family>`); returns its snapshot directory. Deterministic for a seed.
    `eos_token_ids`: the generation config's end-of-turn tokens (default: the tokenizer's EOS);
    `overrides`: config fields over the family's (family_config)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from workers.tiny.builders import SIZES, _save_and_install, train_tokenizer

    tokenizer = tokenizer or train_tokenizer(SIZES["tiny"]["vocab_target"], CONTEXT)
    config = family_config(family, tokenizer, overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation)
        model = model.to(torch.float32).eval()
    output = model.get_output_embeddings()
    if output is not None and not config.tie_word_embeddings:
        with torch.no_grad():
            output.weight.mul_(SIZES["tiny"]["lm_head_scale"])
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id,
                                               eos_token_id=eos_token_ids or config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    return _save_and_install(model, tokenizer, cache_dir, repo_id or f"local/tiny-{family}")
