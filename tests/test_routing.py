"""Where a job goes (workers.adapter.routing, pure): the holder of its model, never a worker left out."""
from __future__ import annotations

from protocol import ModelRef
from workers.adapter.routing import Unconfirmed, choose_worker, without_worker

TABLE = {"loaded": {"local/tiny-llama": ["dead", "alive"]}, "free": {"here": 100.0, "dead": 50.0, "alive": 10.0}}


def test_a_worker_holding_the_model_keeps_the_job():
    assert choose_worker(ModelRef("local/tiny-llama"), "here", {"local/tiny-llama@main"}, TABLE) is None


def test_a_worker_that_did_not_confirm_is_never_chosen_again_and_the_job_goes_to_the_next_holder():
    table = without_worker(TABLE, "dead")
    assert {choose_worker(ModelRef("local/tiny-llama"), "here", set(), table) for _ in range(50)} == {"alive"}
    assert "dead" not in table["free"] and TABLE["loaded"]["local/tiny-llama"] == ["dead", "alive"]  # a copy


def test_a_worker_that_did_not_confirm_is_left_out_until_it_beats_again():
    """A dead worker's beat never changes: it stays out. A live one only slow to confirm is back as soon as
    the table shows a newer beat of its own (not for WORKER_LOST_AFTER, which made its peers load copies)."""
    table = {**TABLE, "beats": {"dead": "t1", "alive": "t1", "here": "t1"}}
    unconfirmed = Unconfirmed(lost_after=60.0)
    unconfirmed.add("dead", table)
    unconfirmed.add("alive", table)
    assert unconfirmed.filter(table)["loaded"]["local/tiny-llama"] == []
    later = {**TABLE, "beats": {"dead": "t1", "alive": "t2", "here": "t2"}}
    assert unconfirmed.filter(later)["loaded"]["local/tiny-llama"] == ["alive"]
    assert "alive" not in unconfirmed and "dead" in unconfirmed
    expired = Unconfirmed(lost_after=-1.0)  # past WORKER_LOST_AFTER the catalog itself has dropped a dead worker
    expired.add("dead", table)
    assert expired.filter(table)["loaded"]["local/tiny-llama"] == ["dead", "alive"]


def test_with_no_holder_left_the_job_stays_here_when_this_worker_has_the_most_room():
    table = without_worker(without_worker(TABLE, "dead"), "alive")
    assert choose_worker(ModelRef("local/tiny-llama"), "here", set(), table) is None


def test_a_full_holder_is_passed_over_for_a_holder_with_room():
    table = {"loaded": {"local/tiny-llama": ["full", "roomy"]}, "free": {"here": 1.0, "full": 1.0, "roomy": 1.0},
             "room": {"full": 0, "roomy": 3}}
    assert {choose_worker(ModelRef("local/tiny-llama"), "here", set(), table) for _ in range(50)} == {"roomy"}


def test_a_full_worker_holding_the_model_passes_the_job_to_another_holder_with_room():
    table = {"loaded": {"local/tiny-llama": ["here", "roomy"]}, "free": {"here": 1.0, "roomy": 1.0},
             "room": {"here": 0, "roomy": 2}}
    held = {"local/tiny-llama@main"}
    assert choose_worker(ModelRef("local/tiny-llama"), "here", held, table, here_full=True) == "roomy"
    assert choose_worker(ModelRef("local/tiny-llama"), "here", held, table, here_full=False) is None


def test_when_every_holder_is_full_the_job_stays_with_a_holder_rather_than_loading_another_copy():
    table = {"loaded": {"local/tiny-llama": ["here", "other"]}, "free": {"here": 1.0, "other": 1.0, "idle": 9e9},
             "room": {"here": 0, "other": 0, "idle": 8}}
    held = {"local/tiny-llama@main"}
    assert choose_worker(ModelRef("local/tiny-llama"), "here", held, table, here_full=True) is None
    assert choose_worker(ModelRef("local/tiny-llama"), "idle", set(), table) in {"here", "other"}


def test_a_prompt_cache_key_keeps_to_one_holder_wherever_the_job_arrives():
    """OpenAI's prompt_cache_key: every worker sends a key's jobs to the same holder (its prefix cache is
    warm there), keys spread over the holders, and a full holder is passed over."""
    ref = ModelRef("local/tiny-llama")
    workers = ["w1", "w2", "w3"]
    table = {"loaded": {"local/tiny-llama": workers}, "free": {w: 10 for w in workers}, "room": {w: 4 for w in workers}}

    def destination(key: str, here: str) -> str:
        return choose_worker(ref, here, {"local/tiny-llama@main"}, table, affinity=key) or here

    homes = {key: {destination(key, here) for here in workers} for key in (f"user-{i}" for i in range(30))}
    assert all(len(home) == 1 for home in homes.values())  # the same worker, wherever the job arrived
    assert {next(iter(home)) for home in homes.values()} == set(workers)  # and keys spread over all of them
    key, home = next((k, next(iter(h))) for k, h in homes.items())
    full = {**table, "room": {**table["room"], home: 0}}
    assert choose_worker(ref, "elsewhere", set(), full, affinity=key) not in (home, None)
