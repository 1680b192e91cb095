"""workers/engine/models/lora_batch.py in-process: a mixed batch's adapter terms in two matmuls per layer equal
peft's own mixed-adapter forward, the base's rows stay the base's, and what it cannot serve goes to peft."""
from __future__ import annotations

import pytest
import torch
from huggingface_hub import snapshot_download
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from workers.engine.models.adapters import BASE_ROW, _no_active_adapter
from workers.engine.models.lora_batch import dense_lora
from workers.tiny.lora import TARGETS

from .conftest import TINY_MODEL


def lora(rank: int, alpha: int, **extra) -> LoraConfig:
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGETS, init_lora_weights=False, lora_dropout=0.0,
                      **extra)


@pytest.fixture
def mixed(hf_cache):
    """The tiny model with three adapters of different ranks and scalings (by layer too; one on fewer
    layers), none active."""
    torch.manual_seed(0)
    snapshot = snapshot_download(TINY_MODEL, cache_dir=hf_cache, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    peft = get_peft_model(model, lora(8, 16), adapter_name="a")
    peft.add_adapter("b", lora(4, 5, rank_pattern={"q_proj": 2}, alpha_pattern={"v_proj": 7}))  # by layer
    peft.add_adapter("c", LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft.eval()
    _no_active_adapter(model)
    return model, peft


ROWS = ["a", BASE_ROW, "b", "c", "a", "c", BASE_ROW, "b"]


def logits(model, peft, rows, ids, dense: bool) -> torch.Tensor:
    with torch.no_grad():
        if not dense:
            return peft(input_ids=ids, adapter_names=rows).logits
        stacked = dense_lora(peft)
        assert stacked.serves()
        with stacked.rows(rows):
            return model(input_ids=ids).logits


def test_dense_terms_equal_peft_mixed_batches_and_leave_base_rows_alone(mixed):
    model, peft = mixed
    ids = torch.randint(5, 200, (len(ROWS), 9))
    ours, peft_mixed = logits(model, peft, ROWS, ids, True), logits(model, peft, ROWS, ids, False)
    torch.testing.assert_close(ours, peft_mixed, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        base = model(input_ids=ids).logits  # outside rows(): the plain base
    for row, name in enumerate(ROWS):
        if name == BASE_ROW:
            assert torch.equal(ours[row], base[row])
        else:
            assert not torch.allclose(ours[row], base[row], atol=1e-2)  # the adapter's term is there


def test_removing_an_adapter_restacks_the_layers(mixed):
    model, peft = mixed
    ids = torch.randint(5, 200, (4, 5))
    logits(model, peft, ["a", "b", "c", BASE_ROW], ids, True)  # stacked with three adapters
    peft.delete_adapter("b")
    _no_active_adapter(model)
    dense_lora(peft).changed()
    rows = ["a", "c", "c", BASE_ROW]
    torch.testing.assert_close(logits(model, peft, rows, ids, True), logits(model, peft, rows, ids, False),
                               rtol=1e-4, atol=1e-4)


def test_a_dora_adapter_is_left_to_peft(mixed):
    model, peft = mixed
    peft.add_adapter("d", lora(4, 8, use_dora=True))
    _no_active_adapter(model)
    dense_lora(peft).changed()
    assert not dense_lora(peft).serves()
