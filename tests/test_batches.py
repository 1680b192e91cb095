"""OpenAI's Files and Batch APIs through the real `openai` SDK against a real `serve`: outputs equal
`model.generate` and the same requests made directly, cancel, bad input, team isolation, a restart.

One server of its own (a small upload bound, a quick runner: polls every 0.3 s, a silent runner's
batches taken over after 2 s, 2 lines at once); the restart test kills it and starts it again last.
"""
from __future__ import annotations

import io
import json
import os
import signal
import time

import httpx
import openai
import pytest
from openai import OpenAI

from .conftest import ENCODER, TINY_MODEL
from .live_server import LiveServer, base_env
from .teams_setup import make_teams, manage

MAX_FILE_BYTES = 20000
FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def batch_env(embed_cache, tmp_path_factory) -> tuple[dict, object]:
    """The text model and the embedding models in its cache."""
    work_dir = tmp_path_factory.mktemp("batch-server")
    env = base_env(embed_cache[0], work_dir, INFERENCE_BATCH_POLL_SECONDS="0.3", INFERENCE_BATCH_LOST_AFTER="2",
                   INFERENCE_BATCH_CONCURRENCY="2", INFERENCE_BATCH_FILE_MAX_BYTES=str(MAX_FILE_BYTES),
                   INFERENCE_WORKER_ACK_TIMEOUT="60")
    return env, work_dir


@pytest.fixture(scope="module")
def live(batch_env):
    env, work_dir = batch_env
    server = LiveServer(env, work_dir, name="batch")
    server.secrets = make_teams(env, teams={"rivals": []}, keys={"rival": ["--team", "rivals"]})
    yield server
    server.stop()


def sdk(live: LiveServer, key: str | None = None) -> OpenAI:
    return OpenAI(base_url=f"{live.base_url}/v1", api_key=key or live.key, max_retries=0, timeout=120)


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def submit(client: OpenAI, lines: list[dict] | bytes, endpoint: str):
    content = lines if isinstance(lines, bytes) else jsonl(lines)
    file = client.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint=endpoint, completion_window="24h")


def wait_final(client: OpenAI, batch_id: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")


def read_lines(client: OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(text) for text in client.files.content(file_id).text.splitlines()]


def ledger_rows(env: dict, request_ids: list[str] | None = None, since: int | None = None) -> list[dict]:
    """The team ledger's rows for these request ids, or of every request that started at `since` or later."""
    where = f"request_id__in={request_ids!r}" if request_ids is not None else \
        f"created_at__gte=datetime.fromtimestamp({since}, timezone.utc)"
    script = ("import json; from datetime import datetime, timezone; from teams.models import UsageRecord; "
              f"print(json.dumps(list(UsageRecord.objects.filter({where})"
              ".values('request_id', 'endpoint', 'status_code', 'cancelled', 'prompt_tokens', 'completion_tokens'))))")
    return json.loads(manage(env, "shell", "-c", script).stdout.strip().splitlines()[-1])


PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground"]


def test_completions_and_chat_batches_equal_the_model_and_the_direct_requests(live, batch_env, reference):
    client = sdk(live)
    completion_lines = [line(f"c-{i}", "/v1/completions", {"model": TINY_MODEL, "prompt": prompt, "max_tokens": 8,
                                                           "temperature": 0})
                        for i, prompt in enumerate(PROMPTS)]
    chat_bodies = [{"model": TINY_MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
                    "temperature": 0} for prompt in PROMPTS[:2]]
    completions = submit(client, completion_lines, "/v1/completions")
    chats = submit(client, [line(f"chat-{i}", "/v1/chat/completions", body) for i, body in enumerate(chat_bodies)],
                   "/v1/chat/completions")
    assert completions.status == "validating" and completions.endpoint == "/v1/completions"

    done = wait_final(client, completions.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 3 and done.request_counts.completed == 3 and done.request_counts.failed == 0
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.error_file_id is None
    output = read_lines(client, done.output_file_id)
    assert [entry["custom_id"] for entry in output] == ["c-0", "c-1", "c-2"]
    for entry, prompt in zip(output, PROMPTS):
        assert entry["id"].startswith("batch_req_") and entry["error"] is None
        assert entry["response"]["status_code"] == 200
        body = entry["response"]["body"]
        assert body["object"] == "text_completion" and body["id"] == entry["response"]["request_id"]
        assert body["choices"][0]["text"] == reference.decode(reference.greedy(reference.encode(prompt), 8))

    chat_done = wait_final(client, chats.id)
    assert chat_done.status == "completed" and chat_done.request_counts.completed == 2
    chat_output = read_lines(client, chat_done.output_file_id)
    for entry, body in zip(chat_output, chat_bodies):
        direct = client.chat.completions.create(**body)
        assert entry["response"]["body"]["object"] == "chat.completion"
        assert entry["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        assert entry["response"]["body"]["usage"]["completion_tokens"] == direct.usage.completion_tokens

    # Each line is a request in the team's ledger, with its tokens.
    ids = [entry["response"]["request_id"] for entry in output + chat_output]
    deadline = time.monotonic() + 15
    while len(rows := ledger_rows(batch_env[0], ids)) < len(ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(row["request_id"] for row in rows) == sorted(ids)
    assert all(row["status_code"] == 200 and row["completion_tokens"] > 0 for row in rows)
    assert {row["endpoint"] for row in rows} == {"/v1/completions", "/v1/chat/completions"}

    listed = client.batches.list(limit=1)
    assert listed.data[0].id == chats.id and listed.has_more
    assert client.batches.list(limit=1, after=chats.id).data[0].id == completions.id
    assert {f.id for f in client.files.list()} >= {done.output_file_id, chat_done.output_file_id}


def test_an_embeddings_batch_equals_the_direct_requests(live):
    """OpenAI's Batch API takes /v1/embeddings lines too: the same vectors and usage as sent directly."""
    client = sdk(live)
    bodies = {"one": {"model": ENCODER, "input": "a short text"},
              "many": {"model": ENCODER, "input": ["first text", "second, longer text"], "dimensions": 16},
              "bad": {"model": ENCODER, "input": ""}}
    batch = wait_final(client, submit(client, [line(k, "/v1/embeddings", b) for k, b in bodies.items()],
                                      "/v1/embeddings").id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    for output in read_lines(client, batch.output_file_id):
        body = output["response"]["body"]
        direct = client.embeddings.create(**bodies[output["custom_id"]], encoding_format="float")
        assert len(body["data"]) == len(direct.data)
        for batched, sent in zip(body["data"], direct.data):
            assert batched["embedding"] == pytest.approx(sent.embedding, abs=1e-6)
        assert body["usage"]["prompt_tokens"] == direct.usage.prompt_tokens > 0
    [error] = read_lines(client, batch.error_file_id)
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400


def test_a_cancelled_batch_stops_and_keeps_what_was_done(live):
    client = sdk(live)
    # A few quick lines, then more slow ones than the engine runs at once: once a quick one is written,
    # the slow ones are hundreds of steps from their end, so the cancel lands before the batch is done.
    lines = [line(f"line-{i}", "/v1/completions", {"model": TINY_MODEL, "prompt": f"Count {i}",
                                                   "max_tokens": 2 if i < 4 else 300, "temperature": 0,
                                                   "ignore_eos": True}) for i in range(40)]
    batch = submit(client, lines, "/v1/completions")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = wait_final(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts.total == 40 and 0 < done.request_counts.completed < 40
    output = read_lines(client, done.output_file_id)
    assert len(output) == done.request_counts.completed
    assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling again changes nothing


def test_bad_input_lines_fail_validation_and_bad_bodies_go_to_the_error_file(live):
    client = sdk(live)
    body = {"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2}
    malformed = jsonl([line("a", "/v1/completions", body)]) + b"{not json\n" + jsonl([
        line("a", "/v1/completions", body),
        {**line("b", "/v1/chat/completions", body)},
        {"custom_id": "c", "method": "GET", "url": "/v1/completions", "body": body}])
    failed = wait_final(client, submit(client, malformed, "/v1/completions").id)
    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    errors = [(e.line, e.code) for e in failed.errors.data]
    assert errors == [(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "invalid_url"), (5, "invalid_method")]

    mixed = [line("ok", "/v1/completions", body),
             line("hot", "/v1/completions", {**body, "temperature": 5}),
             line("nomodel", "/v1/completions", {**body, "model": "nobody/nothing"})]
    done = wait_final(client, submit(client, mixed, "/v1/completions").id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    assert [e["custom_id"] for e in read_lines(client, done.output_file_id)] == ["ok"]
    errors = {e["custom_id"]: e["response"] for e in read_lines(client, done.error_file_id)}
    assert errors["hot"]["status_code"] == 400 and errors["hot"]["body"]["error"]["param"] == "temperature"
    assert errors["nomodel"]["status_code"] == 404 and errors["nomodel"]["body"]["error"]["code"] == "model_not_found"

    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"
    with pytest.raises(openai.APIStatusError) as too_big:
        client.files.create(file=("x.jsonl", io.BytesIO(b"x" * (MAX_FILE_BYTES + 1))), purpose="batch")
    assert too_big.value.status_code == 413
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=done.output_file_id, endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=done.output_file_id, endpoint="/v1/embeddings", completion_window="24h")


def test_another_teams_files_and_batches_do_not_exist_for_it(live):
    owner, rival = sdk(live), sdk(live, live.secrets["rival"])
    batch = submit(owner, [line("x", "/v1/completions", {"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2})],
                   "/v1/completions")
    for call in (lambda: rival.files.retrieve(batch.input_file_id), lambda: rival.files.content(batch.input_file_id),
                 lambda: rival.files.delete(batch.input_file_id), lambda: rival.batches.retrieve(batch.id),
                 lambda: rival.batches.cancel(batch.id),
                 lambda: rival.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/completions",
                                              completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in {b.id for b in rival.batches.list()}
    assert batch.input_file_id not in {f.id for f in rival.files.list()}
    assert wait_final(owner, batch.id).status == "completed"
    assert owner.files.delete(batch.input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        owner.files.retrieve(batch.input_file_id)


def test_lines_whose_record_the_database_refuses_run_again_and_every_run_is_counted(batch_env, tmp_path):
    """The runner's writes fail 3 times (`batch.record=raise*3`): the group is left to run again, and the
    runs that gave it are still in the ledger (work done is never uncounted), beside the runs recorded."""
    env, _ = batch_env
    own = {**env, "INFERENCE_FAILPOINTS": "batch.record=raise*3", "INFERENCE_VAR_DIR": str(tmp_path / "var"),
           "INFERENCE_KEY_DIR": str(tmp_path / "keys")}
    server = LiveServer(own, tmp_path, name="batch-refused")
    try:
        client = sdk(server)
        time.sleep(1.1)  # the ledger check counts every request from the batch's creation (whole seconds) on
        batch = submit(client, [line(f"r-{i}", "/v1/completions", {"model": TINY_MODEL, "prompt": f"Story {i}:",
                                                                    "max_tokens": 4, "temperature": 0})
                                for i in range(2)], "/v1/completions")
        done = wait_final(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 2
        recorded = {entry["response"]["request_id"] for entry in read_lines(client, done.output_file_id)}
        deadline = time.monotonic() + 15  # the refused group's rows reach the ledger through its writer
        while time.monotonic() < deadline:
            served = [row["request_id"] for row in ledger_rows(own, since=batch.created_at) if row["status_code"] == 200]
            if len(served) > len(recorded):
                break
            time.sleep(0.5)
        assert recorded < set(served) and len(served) == len(set(served))
    finally:
        server.stop()


def test_a_batch_survives_a_killed_server_without_running_a_line_twice(live, batch_env):
    """The server is killed while finished lines wait for their record (the runner's writes are slowed by
    a failpoint, so that window is there every time): those lines' usage rows must die with them, as
    their results do, or the lines, run again, would be counted twice."""
    env, work_dir = batch_env
    live.stop()  # the last test of the module: the server is this test's own from here on
    slowed = LiveServer({**env, "INFERENCE_FAILPOINTS": "batch.record=delay(1500)"}, work_dir, name="batch-slowed")
    try:
        client = sdk(slowed)
        bodies = [{"model": TINY_MODEL, "prompt": f"Story {i}:", "max_tokens": 32, "temperature": 0,
                   "ignore_eos": True} for i in range(8)]
        time.sleep(1.1)  # the ledger check below counts every request from the batch's creation (whole seconds) on
        batch = submit(client, [line(f"r-{i}", "/v1/completions", body) for i, body in enumerate(bodies)],
                       "/v1/completions")
        deadline = time.monotonic() + 120
        while (counts := client.batches.retrieve(batch.id).request_counts).completed < 1:  # the first group written
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert counts.completed < 8, "the batch ended before the kill: make its lines longer"
        os.killpg(slowed.process.pid, signal.SIGKILL)  # the runner dies with lines in flight and lines unrecorded
        slowed.process.wait(10)
    finally:
        slowed.stop()

    again = LiveServer(env, work_dir, name="batch-restarted")
    try:
        client = sdk(again)
        done = wait_final(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 8 and done.request_counts.failed == 0
        output = read_lines(client, done.output_file_id)
        assert [entry["custom_id"] for entry in output] == [f"r-{i}" for i in range(8)]
        # No line ran to its end twice: since the batch began, the ledger's served requests are the output's
        # lines, once each (the lines killed in flight left no row; they ran again from the start).
        ids = sorted(entry["response"]["request_id"] for entry in output)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            served = sorted(row["request_id"] for row in ledger_rows(env, since=batch.created_at)
                            if row["status_code"] == 200 and not row["cancelled"])
            if len(served) >= len(ids):
                break
            time.sleep(0.5)
        assert served == ids
        for entry, body in zip(output, bodies):
            direct = client.completions.create(**{k: v for k, v in body.items() if k != "ignore_eos"},
                                               extra_body={"ignore_eos": True})
            assert entry["response"]["body"]["choices"][0]["text"] == direct.choices[0].text
    finally:
        again.stop()


@pytest.mark.django_db
def test_a_group_of_finished_lines_is_written_once_and_counted_once():
    """The runner writes lines that finished together in one transaction, with their usage rows: each line
    once (a line a taken-over runner finished too is not rewritten), the batch's counts moved by what was
    written."""
    from datetime import timedelta

    from django.utils import timezone

    from openai_api.batches import state
    from openai_api.batches.models import Batch, BatchLine
    from teams.ledger import UsageEntry
    from teams.models import Team, UsageRecord

    team = Team.objects.create(name="grouped-writes")
    batch = Batch.objects.create(id="batch_grouped", team=team, endpoint="/v1/completions", status=Batch.IN_PROGRESS,
                                 total=3, expires_at=timezone.now() + timedelta(hours=1))
    lines = [BatchLine.objects.create(batch=batch, index=i, custom_id=f"l{i}", body={}) for i in range(3)]

    def row(request_id: str) -> UsageEntry:
        return UsageEntry(request_id, timezone.now(), team.pk, None, None, "m", "/v1/completions", 3, 4, 1, 2, 200,
                          "length", False, "")

    assert state.record_lines(batch.pk, [state.LineResult(lines[0].pk, {"n": 0}, False, [row("r0")]),
                                         state.LineResult(lines[1].pk, {"n": 1}, True, [row("r1")])]) == 2
    assert [pk for pk, *_ in state.pending_lines(batch.pk, set(), 10)] == [lines[2].pk]
    assert state.record_lines(batch.pk, [state.LineResult(lines[1].pk, {"n": "again"}, False, [row("r1-again")]),
                                         state.LineResult(lines[2].pk, {"n": 2}, False, [row("r2")])]) == 1
    batch.refresh_from_db()
    assert (batch.completed, batch.failed) == (2, 1)
    assert BatchLine.objects.get(pk=lines[1].pk).result == {"n": 1}
    assert state.pending_lines(batch.pk, set(), 10) == []
    # Each run's row went in with its group, the one of the line written before too (that work was done).
    assert sorted(UsageRecord.objects.filter(team=team).values_list("request_id", flat=True)) == \
        ["r0", "r1", "r1-again", "r2"]
