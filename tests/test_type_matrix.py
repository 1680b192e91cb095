"""The generated type matrix (issue 46): every causal-LM `model_type` of the installed transformers, built tiny
from its config's own defaults, loaded by the server's loader and run by the engine's runner (prompts joining
one after another in chunks, and prefilled together) against `generate` for each prompt alone; a new
transformers release adds its new types here by itself. Also the builder itself, in process."""
import pytest
import torch

from workers.tiny.families import FAMILIES
from workers.tiny.type_matrix import causal_lm_types, tiny_config

IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

# The types the engine refuses at load, and the words of why (each checked to still be refused, for that reason).
# Types without a cache the engine can continue (OpenAI GPT, XLM, XLNet, Reformer, RWKV, RecurrentGemma, MiniMax,
# xLSTM) are served by recomputing the whole text each token (workers/engine/execution/kv/recompute.py); CPM-Ant's
# cached path drifts from its whole-text forward (3 % of its logits' norm), so neither serves it as `generate` does.
DECLINED = {"cpmant": "whole-text forward and its own generate give other logits"}

# The types of which no working tiny model is built here, and why (each checked to still fail to build, so the
# list only shrinks: a transformers release that fixes one makes the test say so).
NOT_BUILT = {
    "blt": "a byte-level model of four sub-models (patcher, local encoder and decoder, global transformer)",
    "gemma3n": "its vision tower needs timm, not installed",
    "gemma4_assistant": "a draft model: every layer reads the KV cache of the Gemma 4 model it drafts for",
    "gemma4_unified_assistant": "a draft model: every layer reads the KV cache of the model it drafts for",
    "musicgen": "a decoder of audio codebooks (several ids per step), not text",
    "musicgen_melody": "a decoder of audio codebooks (several ids per step), not text",
    "prophetnet": "transformers' own generate fails on the tiny build (its n-gram decoder's position ids)",
}

# Types that build and load but fail in the engine: bugs, each checked to still fail (so a fix shows here).
KNOWN_FAILING: dict[str, str] = {}

FAMILY_TYPES = {model_type for model_type, _ in FAMILIES.values()}  # checked through the server by the families suite
MATRIX_TYPES = [model_type for model_type in causal_lm_types() if model_type not in FAMILY_TYPES]


@pytest.fixture(scope="module")
def matrix_results(tmp_path_factory) -> dict[str, dict]:
    from bench.types import check_types

    return {result["type"]: result for result in check_types(MATRIX_TYPES, str(tmp_path_factory.mktemp("matrix")))}


@pytest.mark.parametrize("model_type", MATRIX_TYPES)
def test_every_causal_lm_type_decodes_batched_as_generate_does_or_is_declined_at_load(matrix_results, model_type):
    result = matrix_results[model_type]
    if model_type in NOT_BUILT or model_type in KNOWN_FAILING:
        assert result["status"] == "error", f"`{model_type}` works now ({result}): take it off its list"
    elif model_type in DECLINED:
        assert result["status"] == "declined" and DECLINED[model_type] in result["reason"], result
    else:
        assert result["status"] == "equal", result


def test_matrix_lists_every_family_type():
    types = causal_lm_types()
    assert len(types) > 150
    assert {model_type for model_type, _ in FAMILIES.values()} <= set(types)


def test_every_causal_lm_class_of_transformers_is_offered_as_one():
    """The catalog offers a model by its config's `architectures`: every class transformers maps to a causal LM
    is read as one (a `…ForConditionalGeneration` is a media model, read from its vision/audio sections)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from protocol.modalities import model_kind

    classes = {name for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
               for name in (value if isinstance(value, (list, tuple)) else [value])}
    missed = sorted(name for name in classes if not name.endswith("ForConditionalGeneration")
                    and model_kind({"architectures": [name]}) != "causal")
    assert not missed


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


# Decoders whose forward takes no position_ids and counts positions from the cache's length: a left-padded row
# would be decoded at the wrong positions, so the engine measures it at load and decodes them one by one.
POSITIONS_FROM_THE_CACHE = ["bart", "marian", "blenderbot", "trocr"]


@pytest.fixture(scope="module")
def matrix_cache(tmp_path_factory):
    from workers.tiny.type_matrix import build_type_model

    cache = tmp_path_factory.mktemp("type-matrix")
    for model_type in POSITIONS_FROM_THE_CACHE + ["gpt2"]:
        build_type_model(model_type, f"local/tiny-{model_type}", cache)
    return cache


@pytest.mark.parametrize("model_type", POSITIONS_FROM_THE_CACHE)
def test_models_that_count_positions_from_the_cache_decode_one_by_one_as_generate_writes(matrix_cache, model_type):
    """Three prompts of different lengths decoded at once, prompts prefilled in chunks of 5: each row's greedy
    tokens are `generate`'s for that prompt alone, and the runner says at load why it does not batch them."""
    from workers.engine.execution.input_batch import InputBatch
    from workers.engine.execution.runner import ModelRunner, RunnerSettings, sample_batch
    from workers.engine.plan import DecodePlan
    from workers.engine.sequences import Handover
    from workers.engine.step_clock import StepClock

    from .conftest import Reference
    from .test_step_contract import load, new_sequence

    model = f"local/tiny-{model_type}"
    loaded, reference = load(matrix_cache, model), Reference(matrix_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(prefill_chunk=5, max_rows=4))
    assert not runner.spec.batchable and any("decode one by one" in note for note in runner.spec.notes)
    prompts = [reference.encode(text) for text in ("Hi", "Once upon a time there was", "1, 2, 3, 4, 5, 6, 7,")]
    sequences = [new_sequence(loaded, Handover(), ids, 8) for ids in prompts]
    for seq in sequences:
        logits = None
        while logits is None:  # in chunks of 5 tokens
            logits = runner.prefill(seq, 5)[1]
        sample_batch(InputBatch([seq]), logits[None]).apply()
        runner.join([seq])
    while runner.running:
        runner.execute(DecodePlan(runner.view(), StepClock())).apply()
        runner.drop_finished()
    for seq, ids in zip(sequences, prompts):
        assert seq.completion_ids == reference.greedy(ids, 8, min_new_tokens=8), model_type


def test_a_model_that_reads_a_padded_rows_positions_still_batches(matrix_cache):
    from workers.engine.execution.runner import ModelRunner

    from .test_step_contract import load

    runner = ModelRunner(load(matrix_cache, "local/tiny-gpt2"))
    assert runner.spec.batchable and runner.spec.pads_rows and not runner.spec.notes


@pytest.fixture(scope="module")
def odd_cache(tmp_path_factory):
    from workers.tiny.type_matrix import build_type_model

    cache = tmp_path_factory.mktemp("odd-types")
    for model_type in ("openai-gpt", "xlm", "cpmant"):
        build_type_model(model_type, f"local/tiny-{model_type}", cache)
    build_type_model("megatron-bert", "local/tiny-megatron-encoder", cache, is_decoder=False)
    return cache


@pytest.mark.parametrize("model_type", ["openai-gpt", "xlm"])
def test_a_model_that_keeps_no_cache_recomputes_the_whole_text_one_row_at_a_time(odd_cache, model_type):
    """Rather than a 500 for every request, or a refusal: the runner says at load why it recomputes."""
    from workers.engine.execution.runner import ModelRunner

    from .test_step_contract import load

    spec = ModelRunner(load(odd_cache, f"local/tiny-{model_type}")).spec
    assert spec.recomputes and not spec.batchable and not spec.reuses_prefixes
    assert any(note.startswith("its forward returns no cache") and "recomputes the whole text" in note
               for note in spec.notes), spec.notes


def test_a_model_whose_cached_path_drifts_from_its_whole_text_forward_is_refused_at_load_with_why(odd_cache):
    """CPM-Ant prepends prompt tokens of its own, so a prompt continued one token at a time with its cache fails
    in its forward; its own generate (which feeds it differently) drifts from its whole-text forward, so
    recomputing would not give generate's tokens either: refused at load, with both reasons."""
    from workers.engine.errors import ModelLoadError
    from workers.engine.execution.runner import ModelRunner

    from .test_step_contract import load

    with pytest.raises(ModelLoadError, match="its forward fails when a prompt is continued one token at a time.*"
                                             "and its whole-text forward and its own generate give other logits"):
        ModelRunner(load(odd_cache, "local/tiny-cpmant"))


def test_a_model_whose_logits_change_when_its_prompt_is_chunked_prefills_whole(odd_cache):
    """Megatron-BERT with is_decoder: false attends both ways inside a forward, so a prompt cut in two gives other
    logits: measured at load, its prompts prefill whole, and rows joining one after another decode to
    `generate`'s tokens (before, chunked prompts gave other tokens)."""
    from workers.engine.execution.input_batch import InputBatch
    from workers.engine.execution.runner import ModelRunner, RunnerSettings, sample_batch
    from workers.engine.plan import DecodePlan
    from workers.engine.sequences import Handover
    from workers.engine.step_clock import StepClock

    from .conftest import Reference
    from .test_step_contract import load, new_sequence

    model = "local/tiny-megatron-encoder"
    loaded, reference = load(odd_cache, model), Reference(odd_cache, model)
    runner = ModelRunner(loaded, RunnerSettings(prefill_chunk=5, max_rows=4))
    assert not runner.spec.continues_chunks
    prompts = [reference.encode(text) for text in ("Hi", "Once upon a time there was", "1, 2, 3, 4, 5, 6, 7,")]
    sequences = [new_sequence(loaded, Handover(), ids, 8) for ids in prompts]
    for seq in sequences:
        logits = None
        while logits is None:
            logits = runner.prefill(seq, 5)[1]
        sample_batch(InputBatch([seq]), logits[None]).apply()
        runner.join([seq])
        runner.execute(DecodePlan(runner.view(), StepClock())).apply()
        runner.drop_finished()
    while runner.running:
        runner.execute(DecodePlan(runner.view(), StepClock())).apply()
        runner.drop_finished()
    for seq, ids in zip(sequences, prompts):
        assert seq.completion_ids == reference.greedy(ids, 8, min_new_tokens=8)


def test_a_media_model_saved_without_its_processor_is_served_as_text_only(tmp_path, caplog):
    """A Gemma 3 checkpoint with a tokenizer but no preprocessor files: it loads (said once in the log), takes
    text only, and a request with an image is refused with a 400 naming what it takes."""
    import protocol
    from protocol import ModelRef
    from workers.engine.config import TemplateSettings
    from workers.engine.errors import JobError
    from workers.engine.inputs.generation_job import GenerationJob
    from workers.engine.sequences import Handover
    from workers.tiny.type_matrix import build_type_model

    from .test_step_contract import load

    build_type_model("gemma3", "local/tiny-gemma3-no-processor", tmp_path)
    with caplog.at_level("WARNING"):
        loaded = load(tmp_path, "local/tiny-gemma3-no-processor")
    assert loaded.kind == "image_text" and loaded.processor is None and loaded.modalities == ("text",)
    assert "served as text only" in caplog.text
    picture = {"type": "image", "data": b"not read: refused before decoding"}
    job = protocol.submit_message("chatcmpl-1", "reply", ModelRef.parse("local/tiny-gemma3-no-processor"),
                                  [{"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                                              picture]}]}],
                                  protocol.JobParams(max_tokens=4))
    with pytest.raises(JobError) as refused:
        GenerationJob(job, loaded, TemplateSettings(), Handover())
    assert refused.value.status == 400 and "does not take image input (it takes: text)" in str(refused.value)
