"""The generated type matrix's builder (issue 46, item 1, first step): it lists every causal-LM
`model_type` of the installed transformers and shrinks each config's own defaults to a tiny model.
Checked here in process, on the hand-picked families' types: each builds small and its greedy
`generate` matches a step-by-step argmax over its own forward (so the config is a working model)."""
import pytest
import torch

from workers.tiny.families import FAMILIES
from workers.tiny.type_matrix import causal_lm_types, tiny_config

IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def test_matrix_lists_every_family_type():
    types = causal_lm_types()
    assert len(types) > 150
    assert {model_type for model_type, _ in FAMILIES.values()} <= set(types)


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "opt", "bloom", "gpt_neox", "phi3", "mistral"])
def test_tiny_config_builds_a_small_working_model(model_type):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, 300, IDS)).eval()
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = model.generate(prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    ids = prompt
    with torch.no_grad():
        for _ in range(4):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    assert out.tolist() == ids.tolist()
