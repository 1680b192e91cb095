"""The decode step as one static program (workers/engine/execution/static_decode.py), proven on CPU: it runs eagerly here,
forced on (`static_decode="on"`), and must give exactly the tokens of the step over the window and of
`model.generate`, for every kind of cache, across joins, leaves, pauses and prefix hits, with seeded sampling,
logprobs, grammars and several choices. The capture itself (CUDA graphs) is checked by the `gpu`-marked tests,
skipped without CUDA.
"""
from __future__ import annotations

import uuid

import pytest
import torch

import protocol
from workers.engine.config import EngineConfig
from workers.tiny.families import build_tiny_families

from .conftest import Reference, engine_running
from .outbox import Outbox

# Full attention, MLA, every layer sliding, sliding beside full, eager attention with sinks, linear attention, Mamba.
FAMILIES = ["llama", "deepseek-v3", "mistral", "gemma3", "gpt-oss", "qwen3.5", "mamba"]
PROMPTS = ["Hi", "Once upon a time there was a lighthouse keeper", "1, 2, 3,",
           "The capital of France is a city where the river bends twice and the bridges " * 3, "def add(a, b):"]


@pytest.fixture(scope="module")
def families_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("static-families")
    build_tiny_families([*FAMILIES, "bloom"], cache_dir=cache)
    return cache


def submit(engine, outbox: Outbox, model: str, prompt, **params) -> str:
    reply = f"reply.{uuid.uuid4().hex}"
    params = {"temperature": 0, "ignore_eos": True, **params}
    engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(model), [prompt],
                                          protocol.JobParams(**params)))
    return reply


def runner_of(engine, model: str):
    return next(runner for key, runner in engine.runners.items() if key.startswith(model + "@"))


@pytest.mark.parametrize("family", FAMILIES)
def test_static_steps_give_what_generate_gives_across_joins_leaves_pauses_and_prefix_hits(families_cache, family):
    """Rows join at different steps, leave at different steps, batch-class rows pause for an interactive one
    and resume, and a prompt sent again starts from the prefix cache: every one equals `generate`."""
    model = f"local/tiny-{family}"
    reference = Reference(families_cache, model)
    outbox = Outbox()
    config = EngineConfig(max_num_seqs=8, static_decode="on")
    with engine_running(families_cache, outbox.emit, config) as engine:
        plan = [(prompt, 6 + 5 * index, "batch" if index % 2 else "interactive") for index, prompt in enumerate(PROMPTS)]
        replies = []
        for prompt, tokens, priority in plan:
            replies.append(submit(engine, outbox, model, prompt, max_tokens=tokens, priority_class=priority))
            outbox.wait_tokens(replies[-1])  # each joins a running batch
        again = submit(engine, outbox, model, PROMPTS[3], max_tokens=8)
        outbox.wait([*replies, again])
        static = runner_of(engine, model).static
    assert static is not None and static.verified and static.steps > 0
    for reply, (prompt, tokens, _) in zip(replies, plan):
        expected = reference.greedy(reference.encode(prompt), tokens, min_new_tokens=tokens)
        assert outbox.choices(reply)[0]["ids"] == expected, prompt
    expected = reference.greedy(reference.encode(PROMPTS[3]), 8, min_new_tokens=8)
    assert outbox.choices(again)[0]["ids"] == expected


def run_mixed(cache, static: str) -> tuple[dict[str, dict], object]:
    """Seeded sampling, logprobs, a grammar and several choices in one batch; every choice's tokens and
    logprobs, by request."""
    outbox = Outbox()
    requests = {
        "seeded": ("Once upon a time", dict(temperature=0.9, top_p=0.9, seed=7, max_tokens=12)),
        "logprobs": ("1, 2, 3,", dict(logprobs=3, max_tokens=10)),
        "choices": ("A story", dict(temperature=1.0, seed=3, n=3, max_tokens=9)),
        "grammar": ("Answer: ", dict(structured={"type": "regex", "pattern": "(yes|no)[.]"}, max_tokens=5,
                                     ignore_eos=False)),
        "penalised": ("Hello there", dict(repetition_penalty=1.3, max_tokens=11)),
    }
    with engine_running(cache, outbox.emit, EngineConfig(max_num_seqs=8, static_decode=static)) as engine:
        replies = {name: submit(engine, outbox, "local/tiny-llama", prompt, **params)
                   for name, (prompt, params) in requests.items()}
        outbox.wait(list(replies.values()))
        runner = runner_of(engine, "local/tiny-llama")
    return {name: outbox.choices(reply) for name, reply in replies.items()}, runner.static


def test_static_steps_sample_score_and_constrain_as_steps_over_the_window(families_cache):
    static, program = run_mixed(families_cache, "on")
    over_window, none = run_mixed(families_cache, "off")
    assert program is not None and program.verified and program.steps > 0 and none is None
    assert static.keys() == over_window.keys()
    for name in static:
        for index, choice in over_window[name].items():
            assert static[name][index]["ids"] == choice["ids"], name
            assert static[name][index]["logprobs"] == pytest.approx(choice["logprobs"], abs=1e-4), name


def test_a_model_whose_static_program_disagrees_keeps_the_step_over_the_window(families_cache):
    """Bloom builds its ALiBi biases from the 2D mask: the static program's check fails at the first step,
    which (and every later one) is the step over the window, still equal to `generate`."""
    model = "local/tiny-bloom"
    reference = Reference(families_cache, model)
    outbox = Outbox()
    with engine_running(families_cache, outbox.emit, EngineConfig(max_num_seqs=8, static_decode="on")) as engine:
        replies = [submit(engine, outbox, model, prompt, max_tokens=8) for prompt in PROMPTS[:3]]
        outbox.wait(replies)
        static = runner_of(engine, model).static
    assert static is not None and static.verified is False and static.steps == 0
    for reply, prompt in zip(replies, PROMPTS):
        assert outbox.choices(reply)[0]["ids"] == reference.greedy(reference.encode(prompt), 8, min_new_tokens=8)


def test_static_steps_are_off_on_cpu_and_on_with_cuda_unless_set():
    assert EngineConfig().fitted("cpu").static_decode == "off"
    assert EngineConfig().fitted("cuda").static_decode == "on"
    assert EngineConfig(static_decode="off").fitted("cuda").static_decode == "off"
    assert EngineConfig(static_decode="on").fitted("cpu").static_decode == "on"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3.5", "qwen3-moe"])
def test_captured_steps_replay_what_eager_steps_give(tmp_path, family):
    """On CUDA: each bucket's step is captured once and replayed, and gives the tokens the same static program
    gives eagerly (INFERENCE_CUDA_GRAPHS=0); a model whose capture fails (MoE routing syncs with the host)
    runs those buckets eagerly, with the same tokens."""
    build_tiny_families([family], cache_dir=tmp_path)
    model = f"local/tiny-{family}"
    outputs, programs = [], []
    for graphs in (True, False):
        outbox = Outbox()
        config = EngineConfig(max_num_seqs=16, static_decode="on", cuda_graphs=graphs, device="cuda", dtype="float32")
        with engine_running(tmp_path, outbox.emit, config) as engine:
            replies = [submit(engine, outbox, model, prompt, max_tokens=12) for prompt in PROMPTS * 2]
            outbox.wait(replies)
            programs.append(runner_of(engine, model).static)
        outputs.append([outbox.choices(reply)[0]["ids"] for reply in replies])
    captured, eager = programs
    assert captured.verified and (captured.graphs or captured.eager_buckets) and not eager.graphs
    assert outputs[0] == outputs[1]
