"""The engine on its own (plain Python + torch, no Django): what goes out each step, and cancellation."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

import protocol
from workers.engine.config import EngineConfig
from workers.engine.core.engine import Engine

from .conftest import TINY_MODEL, engine_running
from .outbox import Outbox
from .helpers.engine import finished


@pytest.fixture(scope="module")
def engine(hf_cache):
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=8)) as engine:
        yield engine, outbox


def submit(engine: Engine, prompt: str, **params) -> tuple[str, str]:
    request_id, reply = f"cmpl-{uuid.uuid4().hex}", f"reply.{uuid.uuid4().hex}"
    engine.submit(protocol.submit_message(request_id, reply, protocol.ModelRef.parse(TINY_MODEL), [prompt], protocol.JobParams(temperature=0, **params)))
    return request_id, reply


def token_counts(messages: list[dict]) -> list[int]:
    return [sum(len(c["token_ids"]) for c in m["choices"]) for m in messages if m["type"] in (protocol.DELTA, protocol.DONE)]


def test_the_first_token_goes_out_after_prefill_then_one_token_per_step(engine):
    """Time to first token is the prefill alone: the first delta holds one token, not prefill + a decode step."""
    engine, outbox = engine
    _, reply = submit(engine, "Once upon a time", max_tokens=6, ignore_eos=True)
    messages = outbox.wait_for(reply, finished)
    assert [m["type"] for m in messages[:1]] == [protocol.STARTED]
    assert token_counts(messages) == [1] * 6  # one message per step, each with that step's token


def test_requests_in_one_batch_each_get_one_message_per_step(engine):
    engine, outbox = engine
    replies = [submit(engine, f"Prompt {i} goes", max_tokens=5 + i, ignore_eos=True)[1] for i in range(4)]
    for index, reply in enumerate(replies):
        assert token_counts(outbox.wait_for(reply, finished)) == [1] * (5 + index)


def test_a_cancelled_request_stops_within_one_step_and_frees_its_slot(engine):
    engine, outbox = engine
    request_id, reply = submit(engine, "Go on and on", max_tokens=400, ignore_eos=True)
    outbox.wait_for(reply, lambda messages: len(token_counts(messages)) >= 3)
    with outbox.changed:
        engine.cancel(request_id)
        at_cancel = len(outbox.messages[reply])
    deadline = time.monotonic() + 10
    while (request_id in engine.requests or engine.outstanding) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert request_id not in engine.requests and engine.outstanding == 0
    time.sleep(0.2)  # a few more steps' time: nothing more comes
    after = outbox.messages[reply][at_cancel:]
    assert len(after) <= 1 and not finished(after)  # at most the step already under way; no DONE


def test_loads_yield_the_cores_and_leave_the_collector_little_to_scan(engine):
    """The loader thread runs niced (decoding keeps the cores while a model loads), and a load
    freezes what is alive so a garbage collection never stalls every stream for a full scan."""
    import gc
    import os

    engine, outbox = engine
    _, reply = submit(engine, "Once", max_tokens=2)  # the model is loaded by now
    outbox.wait_for(reply, finished)
    assert gc.get_freeze_count() > 100_000  # torch, transformers and the model's modules
    loaders = [t for t in threading.enumerate() if t.name.startswith("model-loader")]
    assert loaders
    for thread in loaders:
        stat = open(f"/proc/self/task/{thread.native_id}/stat").read()
        assert int(stat[stat.rindex(")") + 2:].split()[16]) == 19  # the nice field


def test_the_batch_size_left_open_fits_the_device():
    """INFERENCE_MAX_NUM_SEQS=0 (the default): 256 rows on a GPU, whose step costs about the same for 1 or 256; 32 on CPU."""
    assert EngineConfig(max_num_seqs=0).fitted("cuda").max_num_seqs == 256
    assert EngineConfig(max_num_seqs=0).fitted("cpu").max_num_seqs == 32
    assert EngineConfig(max_num_seqs=12).fitted("cuda").max_num_seqs == 12


def test_the_prefill_chunk_left_open_fits_the_device():
    """INFERENCE_PREFILL_CHUNK=0 (the default): 8,192 prompt tokens a step on a GPU, 512 on CPU; a set one stays."""
    assert EngineConfig(prefill_chunk=0).fitted("cuda").prefill_chunk == 8192
    assert EngineConfig(prefill_chunk=0).fitted("cpu").prefill_chunk == 512
    assert EngineConfig(prefill_chunk=100).fitted("cuda").prefill_chunk == 100


def test_cudnn_attention_is_off_on_cuda_unless_asked_for_and_untouched_elsewhere():
    """INFERENCE_CUDNN_ATTENTION: torch's SDPA flag for cuDNN is set only for a CUDA device."""
    import torch

    from workers.engine.models.model_loader import set_attention_backends

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        set_attention_backends(torch.device("cpu"), False)
        assert torch.backends.cuda.cudnn_sdp_enabled()
        set_attention_backends(torch.device("cuda"), False)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        set_attention_backends(torch.device("cuda"), True)
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def texts(messages: list[dict]) -> str:
    return "".join(c["text"] for m in messages if m["type"] in (protocol.DELTA, protocol.DONE) for c in m["choices"])


def test_a_stream_interval_sends_the_first_token_at_once_then_groups_of_that_many(engine, hf_cache):
    """INFERENCE_STREAM_INTERVAL: fewer messages, the same text; a non-streamed answer still waits for its end."""
    default_engine, default_outbox = engine
    _, reply = submit(default_engine, "Once upon a time", max_tokens=10, ignore_eos=True)
    every_token = default_outbox.wait_for(reply, finished)
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=8, stream_interval=4)) as grouped:
        _, reply = submit(grouped, "Once upon a time", max_tokens=10, ignore_eos=True)
        messages = outbox.wait_for(reply, finished)
        _, whole_reply = submit(grouped, "Once upon a time", max_tokens=10, ignore_eos=True, stream=False)
        whole = outbox.wait_for(whole_reply, finished)
    assert token_counts(every_token) == [1] * 10
    assert token_counts(messages) == [1, 4, 4, 1]
    assert texts(messages) == texts(every_token) == texts(whole)
    assert token_counts(whole) == [1, 9]
