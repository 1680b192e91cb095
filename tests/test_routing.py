"""Where a job goes (workers.adapter.routing, pure): the holder of its model, never a worker left out."""
from __future__ import annotations

from protocol import ModelRef
from workers.adapter.routing import choose_worker, without_worker

TABLE = {"loaded": {"local/tiny-llama": ["dead", "alive"]}, "free": {"here": 100.0, "dead": 50.0, "alive": 10.0}}


def test_a_worker_holding_the_model_keeps_the_job():
    assert choose_worker(ModelRef("local/tiny-llama"), "here", {"local/tiny-llama@main"}, TABLE) is None


def test_a_worker_that_did_not_confirm_is_never_chosen_again_and_the_job_goes_to_the_next_holder():
    table = without_worker(TABLE, "dead")
    assert {choose_worker(ModelRef("local/tiny-llama"), "here", set(), table) for _ in range(50)} == {"alive"}
    assert "dead" not in table["free"] and TABLE["loaded"]["local/tiny-llama"] == ["dead", "alive"]  # a copy


def test_with_no_holder_left_the_job_stays_here_when_this_worker_has_the_most_room():
    table = without_worker(without_worker(TABLE, "dead"), "alive")
    assert choose_worker(ModelRef("local/tiny-llama"), "here", set(), table) is None
