"""The catalog's admin, services and selectors against the test database and the in-process channel layer."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone
from huggingface_hub import constants as hf_constants

from catalog import hf_cache, selectors
from catalog.services import cached_models, model_settings, worker_registry
from catalog.errors import ModelDisabled
from catalog.models import CachedModel, LoadEvent, ModelLoad, Worker
from openai_api.errors import catalog_error
from openai_api.metrics import exposition
import protocol
from workers.tiny.builders import build_non_causal_model, build_tiny_model

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/catalog/cachedmodel/"


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("admin-cache")
    build_tiny_model("local/alpha", cache_dir=cache)
    build_non_causal_model("local/encoder", cache_dir=cache)
    return cache


@pytest.fixture
def cache(small_cache, monkeypatch, tmp_path) -> Path:
    """A private copy of the cache (tests delete from it), made huggingface_hub's default."""
    import shutil

    copy = tmp_path / "hf"
    shutil.copytree(small_cache, copy, symlinks=True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(copy))
    hf_cache.forget_scan()
    selectors.forget_rules()
    cached_models.scan_cache(copy)
    yield copy
    hf_cache.forget_scan()
    selectors.forget_rules()


@pytest.fixture
def listener():
    """A channel in the worker group, and the worker channel: what a worker would receive."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(settings.INFERENCE.fleet.worker_group, channel)

    def receive(from_worker_channel: bool = False) -> dict:
        name = settings.INFERENCE.fleet.worker_channel if from_worker_channel else channel
        return async_to_sync(layer.receive)(name)

    yield receive
    async_to_sync(layer.flush)()


def online_worker(name: str = "gpu-box:1") -> Worker:
    return worker_registry.register_worker(name, "gpu-box", 1, "worker.chan", "cuda", 80_000.0)


def test_scan_records_every_repo_and_marks_vanished_ones_gone_keeping_settings(cache):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    assert alpha.is_causal_lm and alpha.size_on_disk > 0 and alpha.revision in alpha.revisions
    assert alpha.architectures == ["LlamaForCausalLM"] and alpha.modalities == ["text"]
    encoder = CachedModel.objects.get(repo_id="local/encoder")
    assert not encoder.is_causal_lm and encoder.modalities == []
    alpha.idle_timeout, alpha.aliases = 42, ["a"]
    model_settings.save_model_settings(alpha)
    import shutil

    shutil.rmtree(cache / "models--local--alpha")
    assert cached_models.scan_cache(cache).gone == ["local/alpha"]
    alpha.refresh_from_db()
    assert alpha.gone and alpha.idle_timeout == 42
    build_tiny_model("local/alpha", cache_dir=cache)
    assert "local/alpha" in cached_models.scan_cache(cache).updated
    alpha.refresh_from_db()
    assert not alpha.gone and alpha.idle_timeout == 42 and alpha.aliases == ["a"]


def test_aliases_resolve_and_disabled_models_are_unknown(cache):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    alpha.aliases = ["alpha"]
    model_settings.save_model_settings(alpha)
    assert selectors.resolve_model_now("alpha") is None  # the change dropped the kept rules: a read is due
    assert str(selectors.resolve_model("alpha")) == "local/alpha"
    assert str(selectors.resolve_model("alpha@main")) == "local/alpha@main"
    # Now kept: the same answers without a read (what a request asks on its event loop).
    assert str(selectors.resolve_model_now("alpha@main")) == "local/alpha@main"
    assert selectors.resolve_model_now("local/unknown") is None  # a miss takes a fresh scan (and maybe the hub)
    model_settings.set_enabled([alpha], False)
    with pytest.raises(ModelDisabled) as raised:
        selectors.resolve_model("local/alpha")
    with pytest.raises(ModelDisabled):
        selectors.resolve_model_now("alpha")
    error = catalog_error(raised.value)  # what the client gets
    assert error.status == 404 and "disabled" in error.message
    assert [m.repo_id for m, _ in selectors.listed_models()] == []


def test_changelist_shows_status_worker_size_and_filters(admin_client, cache):
    worker = online_worker()
    worker_registry.heartbeat(worker.name, {"local/alpha@main": {"memory_bytes": 2**20, "last_used": 1.7e9}})
    page = admin_client.get(CHANGELIST).content.decode()
    assert "local/alpha" in page and "local/encoder" in page
    assert "loaded" in page and "gpu-box:1" in page
    assert admin_client.get(CHANGELIST, {"q": "encoder"}).content.decode().count("local/alpha") == 0
    causal_only = admin_client.get(CHANGELIST, {"is_causal_lm__exact": "1"}).content.decode()
    assert "local/alpha" in causal_only and "local/encoder" not in causal_only
    workers_page = admin_client.get("/admin/catalog/worker/").content.decode()
    assert "online" in workers_page and "local/alpha" in workers_page


def test_set_idle_timeout_goes_through_a_form_and_reaches_the_workers(admin_client, cache, listener):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    form = admin_client.post(CHANGELIST, {"action": "set_idle_timeout", "_selected_action": [alpha.pk]})
    assert form.status_code == 200 and b'name="idle_timeout"' in form.content
    done = admin_client.post(CHANGELIST, {"action": "set_idle_timeout", "_selected_action": [alpha.pk],
                                          "apply": "1", "idle_timeout": "120"}, follow=True)
    assert b"Idle timeout set on 1 model" in done.content
    alpha.refresh_from_db()
    assert alpha.idle_timeout == 120
    message = listener()
    assert message["type"] == protocol.MODEL_SETTINGS
    assert message["settings"]["local/alpha"]["idle_timeout"] == 120


def test_preload_and_unload_actions_send_control_messages(admin_client, admin_user, cache, listener):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    admin_client.post(CHANGELIST, {"action": "preload_now", "_selected_action": [alpha.pk]})
    load = listener(from_worker_channel=True)
    assert load["type"] == protocol.MODEL_LOAD and load["model"] == {"repo_id": "local/alpha", "revision": None}
    assert load["requested_by"] == f"admin:{admin_user.username}"
    admin_client.post(CHANGELIST, {"action": "unload_now", "_selected_action": [alpha.pk]})
    unload = listener()
    assert unload["type"] == protocol.MODEL_UNLOAD and unload["model"] == {"repo_id": "local/alpha", "revision": None}


def test_disable_and_enable(admin_client, cache, listener):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    admin_client.post(CHANGELIST, {"action": "disable", "_selected_action": [alpha.pk]})
    alpha.refresh_from_db()
    assert not alpha.enabled
    assert listener()["settings"]["local/alpha"]["enabled"] is False
    assert listener()["type"] == protocol.MODEL_UNLOAD  # a disabled model leaves the workers too
    admin_client.post(CHANGELIST, {"action": "enable", "_selected_action": [alpha.pk]})
    alpha.refresh_from_db()
    assert alpha.enabled


def test_list_editable_preload_is_saved_and_broadcast(admin_client, cache, listener):
    rows = list(CachedModel.objects.order_by("repo_id"))
    data = {"form-TOTAL_FORMS": str(len(rows)), "form-INITIAL_FORMS": str(len(rows)), "_save": "Save"}
    for index, row in enumerate(rows):
        data[f"form-{index}-id"] = str(row.pk)
        data[f"form-{index}-idle_timeout"] = "-1" if row.repo_id == "local/alpha" else ""
        data[f"form-{index}-enabled"] = "on"
        if row.repo_id == "local/alpha":
            data[f"form-{index}-preload"] = "on"
    response = admin_client.post(CHANGELIST, data)
    assert response.status_code == 302, response.content[:2000]
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    assert alpha.preload and alpha.idle_timeout == -1
    assert listener()["settings"]["local/alpha"]["preload"] is True


def test_delete_from_cache_asks_first_then_removes_the_files(admin_client, cache, listener):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    confirm = admin_client.post(CHANGELIST, {"action": "delete_from_cache", "_selected_action": [alpha.pk]})
    assert confirm.status_code == 200 and b"Yes, delete the files" in confirm.content
    assert (cache / "models--local--alpha").exists()
    admin_client.post(CHANGELIST, {"action": "delete_from_cache", "_selected_action": [alpha.pk], "apply": "1"})
    assert not (cache / "models--local--alpha").exists()
    alpha.refresh_from_db()
    assert alpha.gone
    assert listener()["type"] == protocol.MODEL_UNLOAD
    assert LoadEvent.objects.filter(model=alpha, error__startswith="deleted from cache").exists()


def test_rescan_action_finds_new_models(admin_client, cache):
    build_tiny_model("local/beta", cache_dir=cache, seed=3)
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    response = admin_client.post(CHANGELIST, {"action": "rescan_cache", "_selected_action": [alpha.pk]}, follow=True)
    assert b"1 added" in response.content
    assert CachedModel.objects.filter(repo_id="local/beta", is_causal_lm=True).exists()


def test_worker_events_record_loads_and_history(cache):
    worker = online_worker()
    worker_registry.record_model_event(worker.name, {"type": "model.loading", "model": "local/alpha@main",
                                              "requested_by": "request"})
    assert selectors.load_state("local/alpha")["status"] == "loading"
    worker_registry.record_model_event(worker.name, {"type": "model.loaded", "model": "local/alpha@main",
                                              "requested_by": "request", "duration_s": 0.5, "memory_bytes": 2**20})
    state = selectors.load_state("local/alpha")
    assert state["status"] == "loaded" and state["loaded_on"] == [worker.name]
    worker_registry.record_model_event(worker.name, {"type": "model.unloaded", "model": "local/alpha@main",
                                              "requested_by": "idle", "duration_s": 0.01})
    assert selectors.load_state("local/alpha") is None
    history = list(LoadEvent.objects.order_by("at").values_list("action", "requested_by"))
    assert history == [("load", "request"), ("unload", "idle")]


def test_a_worker_that_stops_beating_is_lost_and_its_models_not_loaded(cache):
    worker = online_worker()
    worker_registry.heartbeat(worker.name, {"local/alpha@main": {"memory_bytes": 2**20, "last_used": 1.7e9}})
    assert selectors.load_state("local/alpha")["loaded_on"] == [worker.name]
    assert worker_registry.mark_lost_workers() == []
    Worker.objects.filter(pk=worker.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=settings.INFERENCE.fleet.worker_lost_after + 1))
    assert selectors.load_state("local/alpha") is None  # readers see it at once
    assert worker_registry.mark_lost_workers() == [worker.name]
    worker.refresh_from_db()
    assert worker.status == Worker.Status.LOST
    assert ModelLoad.objects.get(worker=worker).status == ModelLoad.Status.UNLOADED
    worker_registry.heartbeat(worker.name, {})  # it comes back
    worker.refresh_from_db()
    assert worker.status == Worker.Status.ONLINE


def test_the_change_form_validates_aliases_and_generation_defaults(admin_client, cache, listener):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    url = f"/admin/catalog/cachedmodel/{alpha.pk}/change/"
    form = {"enabled": "on", "aliases": '["a1"]', "idle_timeout": "", "dtype": "auto", "device": "",
            "chat_template": "", "tensor_parallel_size": "2", "generation_defaults": '{"temperature": 0.5}',
            "loads-TOTAL_FORMS": "0", "loads-INITIAL_FORMS": "0", "_save": "Save"}
    bad = admin_client.post(url, {**form, "generation_defaults": '{"temprature": 0.5}'})
    assert bad.status_code == 200 and b"Unknown key" in bad.content
    assert admin_client.post(url, {**form, "aliases": '"a1"'}).status_code == 200  # not a list: shown again
    negative = admin_client.post(url, {**form, "tensor_parallel_size": "-1"})
    assert negative.status_code == 200 and b"greater than or equal to 0" in negative.content
    no_size = admin_client.post(url, {**form, "kv_cache_memory": "lots"})
    assert no_size.status_code == 200 and b"is not a size in bytes" in no_size.content
    assert admin_client.post(url, {**form, "kv_cache_memory": "512MiB"}).status_code == 302
    alpha.refresh_from_db()
    assert alpha.aliases == ["a1"] and alpha.generation_defaults == {"temperature": 0.5}
    assert alpha.tensor_parallel_size == 2 and alpha.kv_cache_memory == "512MiB"
    sent = listener()["settings"]["local/alpha"]  # what the workers are told
    assert sent["generation_defaults"] == {"temperature": 0.5} and sent["tensor_parallel_size"] == 2
    assert sent["kv_cache_memory"] == "512MiB"


def test_a_config_files_tensor_parallel_size_reaches_the_row_and_the_workers(cache, listener, tmp_path):
    """`serve --config`'s `models:` entry (dashed, as YAML files write it) onto the catalog row, then to workers."""
    from django.core.exceptions import ValidationError
    from django.core.management.base import CommandError

    from inference_site.management.config_files import SERVER_KEYS, load_config

    config = tmp_path / "server.yaml"
    config.write_text("models:\n  - name: local/alpha\n    tensor-parallel-size: 2\n")
    entries = load_config(str(config), SERVER_KEYS)["models"]
    assert entries == [{"name": "local/alpha", "tensor_parallel_size": 2}]
    assert model_settings.configure_models(entries) == ["local/alpha"]
    assert CachedModel.objects.get(repo_id="local/alpha").tensor_parallel_size == 2
    message = listener()
    assert message["type"] == protocol.MODEL_SETTINGS and message["settings"]["local/alpha"]["tensor_parallel_size"] == 2
    assert selectors.model_settings_map()["local/encoder"]["tensor_parallel_size"] == 0  # unset: the server's
    config.write_text("models:\n  - name: local/alpha\n    tensor-parallel-size: two\n")
    with pytest.raises(CommandError, match=r"models\[0\]\.tensor-parallel-size: expected an integer"):
        load_config(str(config), SERVER_KEYS)
    with pytest.raises(ValidationError, match="tensor_parallel_size"):
        model_settings.configure_models([{"name": "local/alpha", "tensor_parallel_size": -1}])
    assert CachedModel.objects.get(repo_id="local/alpha").tensor_parallel_size == 2


def test_admin_rounds_memory_and_durations(admin_client, cache):
    worker = online_worker()
    worker_registry.record_model_event(worker.name, {"type": "model.loaded", "model": "local/alpha@main",
                                              "requested_by": "request", "duration_s": 1.23456789,
                                              "memory_bytes": 920_887})  # 0.87823486328125 MiB
    events = admin_client.get("/admin/catalog/loadevent/").content.decode()
    assert "1.23" in events and "1.2345" not in events
    model = CachedModel.objects.get(repo_id="local/alpha")
    detail = admin_client.get(f"{CHANGELIST}{model.pk}/change/").content.decode()
    assert "0.9" in detail and "0.878" not in detail
    event = LoadEvent.objects.get()
    assert "1.2345" not in admin_client.get(f"/admin/catalog/loadevent/{event.pk}/change/").content.decode()


def test_a_degraded_model_shows_with_its_last_error_until_it_recovers_or_loads_again(admin_client, cache):
    worker = online_worker()
    loaded = {"local/alpha@main": {"memory_bytes": 2**20, "last_used": 1.7e9}}
    failing = {"degraded": True, "failed": 3, "of": 3, "last_error": "RuntimeError: the forward raised"}
    worker_registry.heartbeat(worker.name, loaded, health={"local/alpha@main": failing})
    state = selectors.load_state("local/alpha")
    assert state["status"] == "degraded" and state["loaded_on"] == [worker.name]
    assert state["health"] == {"degraded_on": [worker.name], "failed": 3, "of": 3,
                               "last_error": "RuntimeError: the forward raised"}
    assert dict(selectors.listed_models()[0][1])["health"]["failed"] == 3  # what /v1/models shows
    page = admin_client.get(CHANGELIST).content.decode()
    assert ">degraded<" in page and "3 of 3 failed on gpu-box:1: RuntimeError: the forward raised" in page
    model = CachedModel.objects.get(repo_id="local/alpha")
    assert "the forward raised" in admin_client.get(f"{CHANGELIST}{model.pk}/change/").content.decode()
    metrics = exposition().decode()
    assert 'inference_model_degraded{model_name="local/alpha",worker="gpu-box:1"} 1.0' in metrics
    assert 'inference_model_recent_failures{model_name="local/alpha",worker="gpu-box:1"} 3.0' in metrics

    # Recovered (the worker says so at once), degraded again, then loaded afresh: cleared each time.
    worker_registry.record_model_health(worker.name, protocol.model_health_change(
        "local/alpha@main", {"degraded": False, "failed": 1, "of": 4, "last_error": "RuntimeError: the forward raised"}))
    assert selectors.load_state("local/alpha")["status"] == "loaded"
    assert selectors.load_state("local/alpha")["health"] is None
    worker_registry.record_model_health(worker.name, protocol.model_health_change("local/alpha@main", failing))
    assert selectors.load_state("local/alpha")["status"] == "degraded"
    worker_registry.record_model_event(worker.name, {"type": "model.loaded", "model": "local/alpha@main",
                                                     "requested_by": "admin:root", "memory_bytes": 2**20})
    assert selectors.load_state("local/alpha")["health"] is None
    assert ModelLoad.objects.get(worker=worker).last_error == ""
    assert 'inference_model_degraded{model_name="local/alpha",worker="gpu-box:1"} 0.0' in exposition().decode()
    worker_registry.heartbeat(worker.name, loaded, health={"local/alpha@main": failing})
    worker_registry.heartbeat(worker.name, loaded)  # its record forgotten there (reloaded, say): all clear
    assert selectors.load_state("local/alpha")["status"] == "loaded"


def test_reload_unloads_then_loads_on_each_worker_holding_the_model(admin_client, admin_user, cache, listener):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    done = admin_client.post(CHANGELIST, {"action": "reload_now", "_selected_action": [alpha.pk]}, follow=True)
    assert b"Asked any worker to reload local/alpha" in done.content  # held nowhere: loaded somewhere
    assert listener(from_worker_channel=True)["type"] == protocol.MODEL_LOAD
    worker = online_worker()
    worker_registry.heartbeat(worker.name, {"local/alpha@main": {"memory_bytes": 2**20, "last_used": 1.7e9}})
    done = admin_client.post(CHANGELIST, {"action": "reload_now", "_selected_action": [alpha.pk]}, follow=True)
    assert b"Asked gpu-box:1 to reload local/alpha" in done.content
    receive = async_to_sync(get_channel_layer().receive)
    unload, load = receive(worker.channel_name), receive(worker.channel_name)  # its own channel: in this order
    assert (unload["type"], load["type"]) == (protocol.MODEL_UNLOAD, protocol.MODEL_LOAD)
    assert unload["model"] == load["model"] == {"repo_id": "local/alpha", "revision": None}
    assert load["requested_by"] == f"admin:{admin_user.username}"


@pytest.fixture
def layer_down(settings, redis_port_closed):
    """A Redis channel layer whose server is down (nothing listens on its port)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [f"redis://127.0.0.1:{redis_port_closed}/0"]}}}


@pytest.fixture
def redis_port_closed() -> int:
    from .live_server import free_port

    return free_port()


def test_actions_and_saves_with_the_channel_layer_down_say_so_and_change_nothing(admin_client, cache, layer_down):
    alpha = CachedModel.objects.get(repo_id="local/alpha")
    for action in ("preload_now", "unload_now", "reload_now", "disable"):
        done = admin_client.post(CHANGELIST, {"action": action, "_selected_action": [alpha.pk]}, follow=True)
        assert done.status_code == 200, action
        assert b"The channel layer (Redis) is unavailable" in done.content, action
    alpha.refresh_from_db()
    assert alpha.enabled  # disable rolled back: the workers were never told

    done = admin_client.post(CHANGELIST, {"action": "set_idle_timeout", "_selected_action": [alpha.pk],
                                          "apply": "1", "idle_timeout": "60"}, follow=True)
    assert b"The channel layer (Redis) is unavailable" in done.content
    form = {"enabled": "on", "aliases": "[]", "idle_timeout": "90", "dtype": "auto", "device": "", "chat_template": "",
            "tensor_parallel_size": "0", "generation_defaults": "{}", "loads-TOTAL_FORMS": "0", "loads-INITIAL_FORMS": "0", "_save": "Save"}
    done = admin_client.post(f"{CHANGELIST}{alpha.pk}/change/", form, follow=True)
    assert done.status_code == 200 and b"The channel layer (Redis) is unavailable" in done.content
    alpha.refresh_from_db()
    assert alpha.idle_timeout is None


def test_the_context_a_loaded_copy_serves_is_the_one_v1_models_says(cache):
    """Workers report the context each copy serves (its KV cache budget may cap the model's own) as they load it
    and in every heartbeat; the catalog keeps the shortest live copy's, and /v1/models' card says it."""
    from openai_api.model_list import model_object

    def card() -> dict:
        entries = {model.repo_id: (model, state) for model, state in selectors.listed_models()}
        model, state = entries["local/alpha"]
        return model_object(model, state, {})

    own = card()["max_model_len"]  # loaded nowhere: what its files say
    first, second = online_worker("box:1"), online_worker("box:2")
    worker_registry.record_model_event(first.name, {"type": "model.loaded", "model": "local/alpha@main",
                                                    "requested_by": "request", "memory_bytes": 2**20,
                                                    "max_model_len": own // 2})
    assert card()["max_model_len"] == own // 2
    worker_registry.heartbeat(second.name, {"local/alpha@main": {"memory_bytes": 2**20, "last_used": 1.7e9,
                                                                 "max_model_len": own // 4}})
    assert card()["max_model_len"] == own // 4  # the shortest a loaded copy serves
    worker_registry.heartbeat(second.name, {})  # unloaded there
    assert card()["max_model_len"] == own // 2
