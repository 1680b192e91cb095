"""inference_site/inference_settings.py: every INFERENCE_* variable parsed once, typed, checked, grouped by reader."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from inference_site.inference_settings import MIB, InferenceSettings, SettingError
from workers.engine.config import EngineConfig


def test_the_defaults_run_the_embedded_mode(tmp_path):
    config = InferenceSettings.from_environ({}, tmp_path)
    assert config.var_dir == tmp_path / "var"
    assert config.channel_layer.url == "" and not config.channel_layer.is_redis and config.channel_layer.capacity == 10_000
    assert config.teams.auth_enabled and config.teams.limits_redis_url == ""
    assert config.api.max_n == 16 and config.api.max_request_bytes == 2 * MIB and config.api.default_seed is None
    assert config.api.stop_sequences == () and config.api.cors_origins == ()
    assert config.fleet.worker_channel == "inference" and config.fleet.route_jobs
    assert config.models.default == "local/tiny-llama" and config.models.pinned == ""
    assert config.ledger.spool_dir == tmp_path / "var" / "ledger-spool"
    assert config.batches.files_dir == tmp_path / "var" / "batch-files"
    assert config.edge.listen_backlog == 2048 and config.lifecycle.engine_restarts == 3
    engine = config.engine
    assert isinstance(engine, EngineConfig)
    assert (engine.max_num_seqs, engine.prefill_chunk, engine.batch_rows_beside_interactive) == (0, 0, -1)  # fit the device
    assert engine.memory_budget_bytes is None and engine.kv_cache_bytes is None and engine.seed is None
    assert engine.prefix_cache_bytes == 512 * MIB and engine.templates.reasoning == "auto"
    assert engine.rows_apart_bytes is None  # the device's default (workers/engine/execution/kv/apart.py)


def test_values_are_typed_once_where_they_are_read(tmp_path):
    config = InferenceSettings.from_environ({
        "INFERENCE_MAX_N": " 4 ", "INFERENCE_AUTH": "off", "INFERENCE_ROUTE_JOBS": "No",
        "INFERENCE_DEFAULT_SEED": "0", "INFERENCE_SEED": "7", "INFERENCE_STOP_SEQUENCES": '["a,b", "c"]',
        "INFERENCE_MEDIA_ALLOW_HOSTS": " Example.COM, ,lan ", "INFERENCE_WORKER_MEMORY_BUDGET_MB": "1.5",
        "INFERENCE_STREAM_INTERVAL": "0", "INFERENCE_MODEL": "org/pinned", "CHANNEL_LAYER_URL": "redis://r:6379",
        "INFERENCE_VAR_DIR": str(tmp_path / "elsewhere"), "INFERENCE_CORS_ORIGINS": "*, http://a",
    }, tmp_path)
    assert config.api.max_n == 4 and not config.teams.auth_enabled and not config.fleet.route_jobs
    assert config.api.default_seed == 0 and config.engine.seed == 7
    assert config.api.stop_sequences == ("a,b", "c") and config.api.cors_origins == ("*", "http://a")
    assert config.engine.media.allow_hosts == frozenset({"example.com", "lan"})
    assert config.engine.memory_budget_bytes == int(1.5 * MIB) and config.engine.stream_interval == 1
    assert config.models.default == "org/pinned"
    assert config.channel_layer.is_redis and config.teams.limits_redis_url == "redis://r:6379"  # the layer's Redis
    assert config.ledger.spool_dir == tmp_path / "elsewhere" / "ledger-spool"
    for value, expected in (("off", -1), (" OFF ", -1), ("auto", None), ("128", 128 * MIB), ("0.5", MIB // 2)):
        assert InferenceSettings.from_environ({"INFERENCE_ROWS_APART_MB": value}, tmp_path).engine.rows_apart_bytes \
            == expected, value


@pytest.mark.parametrize(("name", "value", "says"), [
    ("INFERENCE_MAX_N", "lots", "whole number"),
    ("INFERENCE_MAX_QUEUE", "1.5", "whole number"),
    ("INFERENCE_PREFILL_SHARE", "half", "a number"),
    ("INFERENCE_AUTH", "maybe", "1/true/yes/on or 0/false/no/off"),
    ("INFERENCE_STOP_SEQUENCES", "stop", "JSON list of non-empty strings"),
    ("INFERENCE_STOP_SEQUENCES", '["", "x"]', "JSON list of non-empty strings"),
    ("CHANNEL_CAPACITY", "many", "whole number"),
    ("INFERENCE_ROWS_APART_MB", "sometimes", "`auto`, `off`, or MiB"),
    ("INFERENCE_ROWS_APART_MB", "-5", "`auto`, `off`, or MiB"),
])
def test_a_bad_value_is_refused_naming_the_variable(tmp_path, name, value, says):
    with pytest.raises(SettingError) as refused:
        InferenceSettings.from_environ({name: value}, tmp_path)
    assert str(refused.value).startswith(f"{name}={value!r}") and says in str(refused.value)


def test_groups_are_frozen(tmp_path):
    config = InferenceSettings.from_environ({}, tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.api.max_n = 1  # type: ignore[misc]


def test_updated_sets_the_environment_for_workers_started_here_and_reads_again(monkeypatch):
    monkeypatch.setenv("INFERENCE_MAX_N", "5")  # both restored after the test, whatever updated() writes
    monkeypatch.setenv("INFERENCE_MAX_NUM_SEQS", "0")
    before = InferenceSettings.from_environ(os.environ)
    after = before.updated({"INFERENCE_MAX_N": "6", "INFERENCE_MAX_NUM_SEQS": "3"})
    assert (before.api.max_n, after.api.max_n, after.engine.max_num_seqs) == (5, 6, 3)
    assert os.environ["INFERENCE_MAX_N"] == "6"


def test_readers_see_an_override_of_the_settings(settings):
    from openai_api.base import serializer_context

    before = serializer_context()["max_n"]
    settings.INFERENCE = dataclasses.replace(settings.INFERENCE,
                                             api=dataclasses.replace(settings.INFERENCE.api, max_n=before + 1))
    assert serializer_context()["max_n"] == before + 1


def test_settings_py_builds_them_once_from_the_environment():
    from django.conf import settings

    assert isinstance(settings.INFERENCE, InferenceSettings)
    assert Path(settings.VAR_DIR) == settings.INFERENCE.var_dir
    assert settings.AXES_FAILURE_LIMIT == settings.INFERENCE.teams.login_failure_limit
