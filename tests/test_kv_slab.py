"""The preallocated batch cache: rows joining and leaving at any step decode exactly as each alone with generate,
for every kind of layer store (full attention, MLA, sliding windows shifted often, recurrent states); admission
by KV budget."""
from __future__ import annotations

import threading
import uuid

import pytest
import torch
from transformers import DynamicCache

import protocol
from workers.engine.config import EngineConfig
from workers.engine.execution.kv import stores
from workers.engine.execution.kv.slab import SlabKV, attends_with_sdpa
from workers.engine.execution.kv.specs import cache_spec
from workers.tiny.families import build_tiny_families

from workers.tiny.builders import build_tiny_alibi_model, build_tiny_model

from .conftest import TINY_MODEL, Reference, engine_running

PROMPTS = ["Hi", "Once upon a time there was a lighthouse keeper", "1, 2, 3,",
           "The capital of France is a city where the river bends twice and the bridges " * 3, "def add(a, b):"]
# (step it joins at, tokens to generate): the 4th prompt is longer than the batch so far, so the slab moves.
PLAN = [(0, 12), (0, 5), (2, 9), (4, 10), (7, 3)]


def prefill(model, ids: list[int], cache_arg: str = "past_key_values") -> tuple[DynamicCache, int]:
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([ids]), use_cache=True, **{cache_arg: cache}).logits
    return cache, int(logits[0, -1].argmax())


def new_slab(model, row_slots: int) -> SlabKV:
    return SlabKV(model.config, cache_spec(model, torch.device("cpu")), torch.device("cpu"), row_slots)


# One family per kind of store: full attention (Llama), MLA (keys and values of other widths), every layer
# sliding, alternating sliding and full, linear attention beside full, and Mamba (recurrent state alone).
STORE_FAMILIES = ["deepseek-v3", "mistral", "gemma3", "qwen3.5", "mamba"]


@pytest.fixture(scope="module")
def family_references(tmp_path_factory) -> dict[str, Reference]:
    cache = tmp_path_factory.mktemp("families")
    build_tiny_families(STORE_FAMILIES, cache_dir=cache)
    return {family: Reference(cache, f"local/tiny-{family}") for family in STORE_FAMILIES}


def nan_filled(allocate):
    """torch.empty as it may behave: what the memory held before, here NaN everywhere."""
    def allocate_nan(*args, **kwargs):
        return allocate(*args, **kwargs).fill_(float("nan"))
    return allocate_nan


@pytest.mark.parametrize("row_slots,fresh_is_nan", [(4, False), (2, True), (32, True)])
def test_joins_leaves_and_moves_match_generate(reference, monkeypatch, row_slots, fresh_is_nan):
    """Also when fresh buffers hold NaN: every column a decode step reads was written first
    (2 row slots: rows regrow; 32: reserved at once, as on CPU)."""
    joins_and_leaves(reference, monkeypatch, row_slots, fresh_is_nan)


@pytest.mark.parametrize("family", STORE_FAMILIES)
def test_every_kind_of_store_joins_leaves_and_moves_as_generate(family_references, monkeypatch, family):
    """Windows of 16 tokens shifted back every 3 steps, states in slots moved with their rows, MLA's
    keys and values of their own widths; fresh buffers hold NaN."""
    monkeypatch.setattr(stores, "SPARE_WINDOW_COLUMNS", 3)
    joins_and_leaves(family_references[family], monkeypatch, 2, True)


def joins_and_leaves(reference: Reference, monkeypatch, row_slots: int, fresh_is_nan: bool) -> None:
    model = reference.model
    prompts = [reference.encode(p) for p in PROMPTS]
    slab = new_slab(model, row_slots)
    spec = slab.spec
    if fresh_is_nan:  # the stores' buffers (not the model's own scratch tensors, which come from torch.empty)
        monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled(torch.Tensor.new_empty))
    rows: list[int] = []  # prompt index of each batch row
    outputs: dict[int, list[int]] = {}
    with torch.inference_mode():
        for step in range(20):
            joining = [i for i, (at, _) in enumerate(PLAN) if at == step]
            states = []
            for index in joining:
                cache, first = prefill(model, prompts[index], spec.cache_arg)
                outputs[index] = [first]
                states.append(cache)
            slab.add(states, [len(prompts[index]) for index in joining])
            rows.extend(joining)
            if not rows:
                continue
            inputs = slab.decode_inputs([outputs[i][-1] for i in rows])
            logits = model(**inputs, use_cache=True, logits_to_keep=1).logits[:, -1]
            slab.advance()
            for row, index in enumerate(rows):
                outputs[index].append(int(logits[row].argmax()))
            dead = [row for row, index in enumerate(rows) if len(outputs[index]) >= PLAN[index][1]]
            rows = [rows[old] for old in slab.remove(dead)]
    assert slab.rows == 0
    eos = reference.model.generation_config.eos_token_id
    for index, (_, count) in enumerate(PLAN):
        expected = reference.greedy(prompts[index], count)  # generate stops at EOS; the loop above does not
        assert outputs[index][:len(expected)] == expected and (len(expected) == count or expected[-1] == eos), index


def test_padded_rows_give_sdpa_the_mask_transformers_would_build(reference):
    """With rows of different lengths, a decode step hands SDPA its 4D boolean mask itself (transformers
    no longer builds it every step) and the logits are exactly those of the 2D mask; a batch without
    padding keeps the 2D mask, which transformers leaves out as `generate` does."""
    model = reference.model
    assert attends_with_sdpa(model.config)
    with torch.inference_mode():
        slab = new_slab(model, 4)
        prompts = [reference.encode(prompt) for prompt in PROMPTS[:3]]
        states = [prefill(model, ids) for ids in prompts]
        slab.add([cache for cache, _ in states], [len(ids) for ids in prompts])
        logits = {}
        for prepared in (True, False):
            slab.prepared_mask = prepared
            inputs = slab.decode_inputs([first for _, first in states])
            assert inputs["attention_mask"].dim() == (4 if prepared else 2)
            logits[prepared] = model(**inputs, use_cache=True, logits_to_keep=1).logits  # writes the same column
        assert torch.equal(logits[True], logits[False])
        alone = new_slab(model, 4)
        cache, first = prefill(model, reference.encode(PROMPTS[1]))
        alone.add([cache], [len(reference.encode(PROMPTS[1]))])
        assert alone.decode_inputs([first])["attention_mask"].dim() == 2


ALIBI_MODEL = "local/tiny-falcon-alibi"


def test_the_engine_hands_over_the_mask_only_where_it_gives_the_same_logits(tmp_path):
    """The first padded decode step checks the 4D mask against transformers' own: the Llama takes it from
    then on; the ALiBi Falcon, which builds its biases from the 2D mask (the 4D one fails there), keeps
    the 2D mask. Rows of different lengths decode together on both, each as `generate` alone."""
    hf_cache = tmp_path / "hf"  # a cache of its own: the session's lists its models to other tests
    build_tiny_model(TINY_MODEL, size="tiny", cache_dir=hf_cache)
    build_tiny_alibi_model(ALIBI_MODEL, cache_dir=hf_cache)
    reference, falcon = Reference(hf_cache), Reference(hf_cache, ALIBI_MODEL)
    prompts = PROMPTS[:3]
    done = threading.Semaphore(0)
    tokens: dict[str, list[int]] = {}

    def emit(channel: str, message: dict) -> None:
        for choice in message.get("choices", []):
            tokens.setdefault(channel, []).extend(choice["token_ids"])
        if message["type"] in (protocol.DONE, protocol.ERROR):
            done.release()

    with engine_running(hf_cache, emit, EngineConfig(max_num_seqs=8)) as engine:
        replies = {}
        for model in (TINY_MODEL, ALIBI_MODEL):
            for prompt in prompts:
                replies[model, prompt] = reply = f"reply.{uuid.uuid4().hex}"
                engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(model),
                                                      [prompt], protocol.JobParams(temperature=0, max_tokens=8,
                                                                                   ignore_eos=True)))
        for _ in replies:
            assert done.acquire(timeout=120)
        masks = {key.split("@")[0]: runner.batch.prepared_mask for key, runner in engine.runners.items()}
    assert masks == {TINY_MODEL: True, ALIBI_MODEL: False}
    for (model, prompt), reply in replies.items():
        ground = reference if model == TINY_MODEL else falcon
        assert tokens[reply] == ground.greedy(ground.encode(prompt), 8, min_new_tokens=8), (model, prompt)
