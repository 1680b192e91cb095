"""The seeds' options: Open WebUI: context errors in the request's terms, one reading of a model's context."""
from __future__ import annotations

import time

import httpx

from ..helpers.seed_options import FIRST_RUN, listed, sdk


LONG = " ".join(["word"] * 700)  # past the tiny models' 512 tokens


def test_context_errors_say_what_fits_and_name_the_endpoints_fields(keyed):
    def post(path: str, body: dict) -> dict:
        response = httpx.post(f"{keyed.base_url}{path}", headers=keyed.headers, json=body, timeout=60)
        assert response.status_code == 400, response.text
        return response.json()["error"]

    error = post("/v1/chat/completions", {"messages": [{"role": "system", "content": LONG},
                                                       {"role": "user", "content": "Hi"}]})
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded"
    assert "shorten the `messages` to at most 511 tokens" in error["message"], error["message"]
    error = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                          "max_completion_tokens": 100000})
    assert error["param"] == "max_completion_tokens"
    assert "set `max_completion_tokens` to at most" in error["message"] and "`prompt`" not in error["message"]
    error = post("/v1/responses", {"input": LONG, "max_output_tokens": 16})
    assert error["param"] == "input" and "shorten the `input` to at most 496 tokens" in error["message"]


def open_webui_tools(count: int = 36) -> list[dict]:
    """Tool definitions shaped as Open WebUI's, as many as it sends with every message."""
    words = "search the notes of the user for a term and give back the matching lines with their dates".split()
    return [{"type": "function", "function": {
        "name": f"tool_{index}", "description": " ".join(words * 3),
        "parameters": {"type": "object", "required": ["query"], "properties": {
            name: {"type": "string", "description": " ".join(words)} for name in ("query", "folder", "since", "kind")}}}}
        for index in range(count)]


def test_the_first_run_model_holds_open_webuis_tool_list(keyed):
    """A chat with a third of Open WebUI's 36 tool definitions (~5k tokens here: its whole list, ~15k, took 13 s
    to prefill on 2 busy cores) fits the model serve builds on a first run, 10x the 512 tokens it had; without
    max_tokens its generation_config.json's max_new_tokens (512) ends an answer."""
    model = next(m for m in listed(keyed).values() if m["id"] == FIRST_RUN)
    assert model["max_model_len"] == 32768
    client = sdk(keyed)
    result = client.chat.completions.create(model=FIRST_RUN, tools=open_webui_tools(12), max_tokens=2,
                                            messages=[{"role": "user", "content": "Hello"}])
    assert result.usage.prompt_tokens > 4000, result.usage
    endless = client.chat.completions.create(model=FIRST_RUN, messages=[{"role": "user", "content": "Hello"}],
                                             extra_body={"ignore_eos": True})
    assert endless.usage.completion_tokens == 512 and endless.choices[0].finish_reason == "length"


def test_one_reading_of_a_models_context():
    from protocol.context_length import context_length

    vision = {"vision_config": {"image_size": 32}, "text_config": {"max_position_embeddings": 32768}}
    assert context_length(vision, 512) == 32768  # the text model's, not the tokenizer's
    assert context_length({"max_position_embeddings": 4096, "text_config": {"max_position_embeddings": 8}}) == 4096
    assert context_length({}, 1024) == 1024 and context_length({}, 10**30) == 2048


def test_omni_models_take_images_video_and_audio():
    """Gemma 3n/4 (vision and audio encoders beside the text model) and Qwen2.5-Omni (the same in its
    thinker_config) are classed as taking audio too, not image-only."""
    from protocol.modalities import input_modalities, model_kind

    gemma = {"architectures": ["Gemma4ForConditionalGeneration"], "text_config": {}, "vision_config": {},
             "audio_config": {}}
    qwen_omni = {"architectures": ["Qwen2_5OmniForConditionalGeneration"], "talker_config": {},
                 "thinker_config": {"text_config": {}, "vision_config": {}, "audio_config": {}}}
    for config in (gemma, qwen_omni):
        assert model_kind(config) == "omni"
        assert set(input_modalities(model_kind(config))) == {"text", "image", "video", "audio"}
    assert model_kind({"text_config": {}, "vision_config": {}}) == "image_text"


def test_download_progress_reports_bytes_as_they_arrive():
    """/load_model's `download` stage: the bytes huggingface_hub's snapshot_download writes, through its own
    progress-bar factory (no hub here to download from)."""
    from huggingface_hub.utils.tqdm import _create_progress_bar

    from workers.engine.models import model_loader

    events = []
    bar_class = model_loader.bytes_progress(lambda stage, value=None: events.append((stage, value)))
    files = _create_progress_bar(cls=bar_class, log_level=20, name="huggingface_hub.snapshot_download.transfer",
                                 total=0, unit="B")
    written = _create_progress_bar(cls=bar_class, log_level=20, name="huggingface_hub.snapshot_download",
                                   total=0, unit="B")
    written.total = 3000
    for _ in range(3):
        files.update(1000)  # the network side's bar says nothing: the bytes on disk are what counts
        written.update(1000)
        time.sleep(model_loader.DOWNLOAD_EVENT_SECONDS)
    assert events == [("download", {"current": n, "total": 3000}) for n in (1000, 2000, 3000)]
