"""Read-only questions about models: what a name means, how the catalog wants each model
served and where it is loaded (what the cache on disk holds is `catalog.hf_cache`)."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import connections
from django.utils import timezone

from protocol.hub import hub_reachable
from protocol.output_formats import ParserChoice, choose_parsers
from protocol import ModelRef

from .errors import ModelDisabled, ModelNotFound
from .hf_cache import CacheEntry, cached_served_models, cached_served_models_now, detected_parsers, gguf_entry_name
from .models import CachedModel, ModelLoad, Worker
from .snapshots import Snapshot

RULES_TTL_SECONDS = 2.0
RULES_STALE_LIMIT_SECONDS = 10.0  # rules this old are no longer answered while new ones are read (catalog/snapshots.py)


def find_cached_model(name: str, fresh: bool = False) -> CacheEntry | None:
    """The enabled cached model a name (or alias) means; `fresh` rescans the cache first."""
    repo_id = canonical_repo_id(name)
    if repo_id in catalog_rules()[1]:
        return None
    return next((m for m in cached_served_models(fresh) if m.repo_id == repo_id), None)


# --- the catalog's rules: aliases and disabled models, read again every couple of seconds ---

def _read_rules() -> tuple[dict[str, str], set[str]]:
    aliases, disabled = {}, set()
    for repo_id, names, enabled in CachedModel.objects.filter(gone=False).values_list("repo_id", "aliases", "enabled"):
        for alias in names or ():
            aliases[str(alias)] = repo_id
        if not enabled:
            disabled.add(repo_id)
    return aliases, disabled


# A background read runs in a thread of its own, whose database connection is closed after it.
_rules = Snapshot(_read_rules, RULES_TTL_SECONDS, RULES_STALE_LIMIT_SECONDS, "the catalog's rules",
                  after_background_read=connections.close_all)


def catalog_rules() -> tuple[dict[str, str], set[str]]:
    """({alias: repo_id}, {disabled repo_id}) from the catalog."""
    return _rules.get()


def forget_rules() -> None:
    _rules.forget()


def canonical_repo_id(name: str, aliases: dict[str, str] | None = None) -> str:
    """The repo id a model name or alias refers to (the `@revision` dropped); `aliases`: the catalog's."""
    repo_id = ModelRef.parse(name).repo_id
    aliases = catalog_rules()[0] if aliases is None else aliases
    repo_id = aliases.get(repo_id, aliases.get(name, repo_id))
    if ":" in repo_id:  # `repo:Q4_K_M`: the GGUF file of that quantization type (protocol/gguf.py)
        kept = cached_served_models_now()  # no disk read where the kept scan may answer (an event loop's caller)
        repo_id = gguf_entry_name(repo_id, kept if kept is not None else cached_served_models())
    return repo_id


def model_settings_map() -> dict[str, dict]:
    """Per-model settings as workers take them (protocol ModelSettings); the pinned model's say preloaded and
    never unloaded (and whether its code may run), whatever its row says."""
    fields = ("repo_id", "enabled", "idle_timeout", "preload", "dtype", "device", "chat_template", "generation_defaults",
              "quantization", "trust_remote_code", "attn_implementation", "tool_parser", "reasoning_parser", "gguf_file",
              "speculative_config", "tensor_parallel_size", "kv_cache_memory")
    by_model = {row["repo_id"]: {k: v for k, v in row.items() if k != "repo_id"}
                for row in CachedModel.objects.filter(gone=False).values(*fields)}
    config = settings.INFERENCE.models
    if config.pinned:
        repo_id = ModelRef.parse(config.pinned).repo_id
        own = by_model.setdefault(repo_id, {"enabled": True})
        own.update(preload=True, idle_timeout=-1,
                   trust_remote_code=bool(own.get("trust_remote_code")) or config.pinned_trust_remote_code)
    return by_model


def preload_models() -> list[str]:
    """The models a worker loads when it starts: the pinned one first, then the catalog's preloaded ones."""
    pinned = settings.INFERENCE.models.pinned
    rows = CachedModel.objects.filter(gone=False, enabled=True, preload=True).values_list("repo_id", flat=True)
    return [pinned] * bool(pinned) + [repo_id for repo_id in rows if repo_id != pinned]


# --- where models run -----------------------------------------------------------

def worker_is_alive(worker: Worker) -> bool:
    """Online and heard from recently (a silent worker is lost even before anyone marks it)."""
    if worker.status != Worker.Status.ONLINE or worker.last_heartbeat is None:
        return False
    return (timezone.now() - worker.last_heartbeat).total_seconds() <= settings.INFERENCE.fleet.worker_lost_after


def live_workers() -> list[Worker]:
    return [w for w in Worker.objects.filter(status=Worker.Status.ONLINE) if worker_is_alive(w)]


STATUS_ORDER = {ModelLoad.Status.LOADED: 3, ModelLoad.Status.LOADING: 2, ModelLoad.Status.ERROR: 1}


def load_states(loads=None) -> dict[str, dict]:
    """{repo_id: {"status": loaded|degraded|loading|error, "loaded_on": [worker], "last_used", "memory_mb",
    "max_model_len", "health"}} on live workers (`memory_mb`: what one loaded copy holds, quantized weights as
    packed; `max_model_len`: the shortest context a loaded copy serves; both None while loaded nowhere). A
    loaded model failing most of its recent requests on some worker is *degraded*, its
    `health` {"degraded_on": [worker], "failed", "of", "last_error"} (else None)."""
    states: dict[str, dict] = {}
    alive = [w.pk for w in live_workers()]
    rows = ((loads if loads is not None else ModelLoad.objects).filter(worker_id__in=alive).exclude(status=ModelLoad.Status.UNLOADED)
            .select_related("model", "worker"))
    for row in rows:
        state = states.setdefault(row.model.repo_id, {"status": row.status, "loaded_on": [], "last_used": None,
                                                      "error": "", "memory_mb": None, "max_model_len": None,
                                                      "health": None})
        if STATUS_ORDER.get(row.status, 0) > STATUS_ORDER.get(state["status"], 0):
            state["status"] = row.status
        if row.status == ModelLoad.Status.LOADED:
            state["loaded_on"].append(row.worker.name)
            state["memory_mb"] = max(state["memory_mb"] or 0.0, row.memory_mb)
            if row.max_model_len:
                state["max_model_len"] = min(state["max_model_len"] or row.max_model_len, row.max_model_len)
        if row.status == ModelLoad.Status.ERROR:
            state["error"] = row.error
        if row.status == ModelLoad.Status.LOADED and row.degraded:
            _add_degraded(state, row)
        if row.last_used and (state["last_used"] is None or row.last_used > state["last_used"]):
            state["last_used"] = row.last_used
    for state in states.values():
        if state["health"] is not None:
            state["status"] = "degraded"
    return states


def _add_degraded(state: dict, row: ModelLoad) -> None:
    """A loaded copy failing most of its recent requests: counted into its model's `health`."""
    health = state["health"] = state["health"] or {"degraded_on": [], "failed": 0, "of": 0, "last_error": ""}
    health["degraded_on"].append(row.worker.name)
    health["failed"] += row.recent_failed
    health["of"] += row.recent_jobs
    health["last_error"] = row.last_error or health["last_error"]


def serves(state: dict | None) -> bool:
    """Whether a load state (`load_state`'s) says the model is loaded somewhere, degraded or not."""
    return state is not None and state["status"] in (ModelLoad.Status.LOADED, "degraded")


def load_state(repo_id: str) -> dict | None:
    """One model's load state on live workers, or None when it is on none."""
    return load_states(ModelLoad.objects.filter(model__repo_id=repo_id)).get(repo_id)


def models_on_worker(worker: Worker) -> list[str]:
    return list(ModelLoad.objects.filter(worker=worker, status=ModelLoad.Status.LOADED)
                .values_list("model__repo_id", flat=True))


def routing_table() -> dict:
    """What a worker needs to pass a job on: {"loaded": {repo_id: [worker channel]}, "free": {channel: MiB},
    "room": {channel: jobs}, "beats": {channel: its last heartbeat}}. A beat is only ever compared with an
    earlier beat of the same worker (has it beaten since?), never with another machine's clock."""
    workers = [w for w in live_workers() if w.channel_name]
    free = {w.channel_name: (w.memory_total_mb or 0.0) - w.memory_used_mb for w in workers}
    loaded: dict[str, list[str]] = {}
    rows = ModelLoad.objects.filter(worker__in=workers, status=ModelLoad.Status.LOADED)
    for repo_id, channel in rows.values_list("model__repo_id", "worker__channel_name"):
        loaded.setdefault(repo_id, []).append(channel)
    room = {w.channel_name: w.free_slots for w in workers if w.free_slots is not None}
    beats = {w.channel_name: w.last_heartbeat.isoformat() for w in workers if w.last_heartbeat is not None}
    return {"loaded": loaded, "free": free, "room": room, "beats": beats}


def listed_models() -> list[tuple[CacheEntry, dict]]:
    """The enabled cached models, each with its load state (status "cached" when on no worker) and the
    parsers its answers get (`parsers`: the catalog's overrides over what its files say)."""
    states = load_states()
    disabled = catalog_rules()[1]
    overrides = {row[0]: row[1:] for row in CachedModel.objects.filter(gone=False).exclude(
        tool_parser="", reasoning_parser="", chat_template="").values_list(
        "repo_id", "tool_parser", "reasoning_parser", "chat_template")}
    return [(m, {**states.get(m.repo_id, {"status": "cached", "loaded_on": [], "last_used": None, "health": None}),
                 "parsers": effective_parsers(m.parsers, *overrides.get(m.repo_id, ()), snapshot=m.snapshot_path)})
            for m in cached_served_models() if m.repo_id not in disabled]


def snapshot_path(repo_id: str) -> Path | None:
    """The served snapshot of a cached model (None: not one the server serves)."""
    return next((m.snapshot_path for m in cached_served_models() if m.repo_id == repo_id), None)


def effective_parsers(detected: dict, tool_override: str = "", reasoning_override: str = "", chat_template: str = "",
                      snapshot: Path | None = None) -> dict:
    """{tool_parser, reasoning_parser, source}: the override where the catalog has one, else what was detected
    (from the catalog's `chat_template` for the model where it has one: the `snapshot`'s other files with it)."""
    if not detected:
        return {}
    if chat_template and snapshot is not None:
        detected = detected_parsers(snapshot, chat_template)
    choice = ParserChoice(detected["tool_parser"], detected["reasoning_parser"], detected["source"])
    try:
        return choose_parsers(choice, tool_override, reasoning_override).as_dict()
    except ValueError:  # a name saved before it was checked: the worker ignores it too
        return choice.as_dict()


def resolve_model_now(name: str) -> ModelRef | None:
    """`resolve_model`'s answer when the kept rules and scan give it without reading anything (a cached,
    served model, or a disabled one: ModelDisabled), so the caller may ask on its event loop; None when
    it takes a read (the database, the disk, the hub)."""
    rules, models = _rules.peek(), cached_served_models_now()
    if rules is None or models is None:
        return None
    resolved = _named(name, rules)
    return resolved if any(m.repo_id == resolved.repo_id for m in models) else None


def _named(name: str, rules: tuple[dict[str, str], set[str]]) -> ModelRef:
    """The model a name or alias stands for under the catalog's (aliases, disabled); ModelDisabled if disabled."""
    aliases, disabled = rules
    repo_id = canonical_repo_id(name, aliases)
    if repo_id in disabled:
        raise ModelDisabled(name)
    return ModelRef(repo_id, ModelRef.parse(name).revision)


def resolve_model(name: str) -> ModelRef:
    """The model a job carries for a client's model name (an alias becomes its repo id, any revision kept).

    Raises ModelDisabled, or ModelNotFound when offline (HF_HUB_OFFLINE, or the hub not
    reachable within a moment) and not in the cache (even after a fresh scan); online, unknown
    names pass through so the worker can download them.
    """
    resolved = _named(name, catalog_rules())
    name = str(resolved)
    if find_cached_model(name) is not None or find_cached_model(name, fresh=True) is not None:
        return resolved
    if not hub_reachable():
        raise ModelNotFound(name)
    return resolved
