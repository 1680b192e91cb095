"""The engine's Prometheus metrics, under vLLM's names so existing Grafana dashboards work.

Plain prometheus-client, no Django. The engine thread calls these hooks; `/metrics` on the web
side exposes them (embedded mode: the same process; several processes on a host: set
PROMETHEUS_MULTIPROC_DIR for all of them and one scrape of any web process sees every worker).
Times are per request as vLLM defines them: queue time from arrival to the start of its
prefill, time to first token from arrival, inter-token latency between a choice's tokens,
end-to-end latency from arrival to its last token.
"""
from __future__ import annotations

import time
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

import protocol

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

MODEL = ["model_name"]
RUNNING = Gauge("vllm:num_requests_running", "Requests with a choice being prefilled or decoded.", MODEL,
                multiprocess_mode="livesum")
WAITING = Gauge("vllm:num_requests_waiting", "Requests admitted and waiting for a batch slot.", MODEL,
                multiprocess_mode="livesum")
TTFT = Histogram("vllm:time_to_first_token_seconds", "Time from a request's arrival to its first token.", MODEL,
                 buckets=LATENCY_BUCKETS)
ITL = Histogram("vllm:inter_token_latency_seconds", "Time between two tokens of one choice.", MODEL,
                buckets=LATENCY_BUCKETS)
E2E = Histogram("vllm:e2e_request_latency_seconds", "Time from a request's arrival to its end.", MODEL,
                buckets=LATENCY_BUCKETS)
QUEUE = Histogram("vllm:request_queue_time_seconds", "Time a request waited before its prefill began.", MODEL,
                  buckets=LATENCY_BUCKETS)
PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", MODEL)
GENERATION_TOKENS = Counter("vllm:generation_tokens", "Generated tokens of finished requests.", MODEL)
SUCCESS = Counter("vllm:request_success", "Requests that finished (not cancelled or failed).",
                  [*MODEL, "finished_reason"])
PREFIX_CACHE_QUERIES = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", MODEL)
PREFIX_CACHE_HITS = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (hit rate: hits / queries).",
                            MODEL)
KV_USAGE = Gauge("vllm:kv_cache_usage_perc", "Fraction of the model's KV cache budget in use, its prefix cache's "
                 "entries too (1 = full).", MODEL, multiprocess_mode="livemax")
PREEMPTIONS = Counter("vllm:num_preemptions", "Rows preempted to keep within the KV cache budget (their keys/values "
                      "dropped, prefilled again later).", MODEL)
SPEC_DRAFTS = Counter("vllm:spec_decode_num_drafts", "Verifications of drafted tokens (one per proposing row and step).",
                      MODEL)
SPEC_DRAFT_TOKENS = Counter("vllm:spec_decode_num_draft_tokens", "Tokens proposed by speculative decoding.", MODEL)
SPEC_ACCEPTED = Counter("vllm:spec_decode_num_accepted_tokens", "Drafted tokens the model accepted.", MODEL)
SPEC_MEAN_LENGTH = Gauge("inference_spec_decode_mean_accepted_length",
                         "Tokens a verifying row takes per step, since start (1 + accepted / drafts).", MODEL)
BATCH_SIZE = Histogram("inference_batch_size", "Sequences decoded together in one engine step.", buckets=BATCH_BUCKETS)
# Per team (labels bounded by the number of teams): the fair-share scheduler's view.
TEAM = ["team"]
TEAM_RUNNING = Gauge("inference_team_sequences_running", "Sequences of the team in the batch or prefilling.", TEAM,
                     multiprocess_mode="livesum")
TEAM_WAITING = Gauge("inference_team_sequences_waiting", "Sequences of the team waiting for a slot (paused ones too).",
                     TEAM, multiprocess_mode="livesum")
TEAM_TOKENS = Counter("inference_team_generation_tokens", "Tokens generated for the team.", TEAM)
TEAM_TTFT = Histogram("inference_team_time_to_first_token_seconds", "Time from a request's arrival to its first token.",
                      TEAM, buckets=LATENCY_BUCKETS)
TEAM_PREEMPTED = Counter("inference_team_preemptions", "Sequences of the team paused to give their slot to others.", TEAM)
STEP = Histogram("inference_step_seconds", "Wall time of one engine step: decode, publish, prefill.",
                 buckets=(0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0))
STEP_PHASE = Counter("inference_step_phase_seconds", "Engine time by phase of its steps (workers/engine/step_clock.py).",
                     ["phase"])
TP_MESSAGES = Counter("inference_tensor_parallel_messages", "Op messages rank 0 sent its follower ranks (one per "
                      "forward of a model split over ranks, workers/engine/parallel/).", MODEL)
TP_SEND = Counter("inference_tensor_parallel_send_seconds", "Time rank 0 spent sending those messages.", MODEL)
MODEL_LOAD = Histogram("inference_model_load_seconds", "Time to load a model on a worker.", MODEL,
                       buckets=LOAD_BUCKETS)


def observe_many(histogram, value: float, count: int) -> None:
    """`histogram.observe(value)` `count` times, at the cost of one (prometheus-client's Histogram child:
    its sum and the bucket the value falls in; every observation after the first alike)."""
    if count == 1 or not hasattr(histogram, "_upper_bounds"):
        for _ in range(count):
            histogram.observe(value)
        return
    histogram._sum.inc(value * count)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds):
        if value <= bound:
            bucket.inc(count)
            break


def team_label(team: str) -> str:
    """A team's label: its name; jobs that name none (auth off, a worker's own) count as "default"."""
    return team or "default"


def label(model: str) -> str:
    """A model's label: its name as clients send it (`repo`, or `repo@revision` off the default branch)."""
    return model.removesuffix(f"@{protocol.DEFAULT_REVISION}")


class EngineMetrics:
    """Per-request timing state the hooks need, kept beside the engine rather than in its requests."""

    def __init__(self) -> None:
        self._first_token: set[str] = set()  # request ids that produced a token
        self._scheduled: set[str] = set()  # request ids whose prefill began
        self._last_token: dict[int, float] = {}  # id(sequence) -> when its last token came
        self._gauges: dict[str, tuple[int, int]] = {}  # model -> (running, waiting) last set
        self._team_gauges: dict[str, tuple[int, int]] = {}
        self._itl: dict[str, object] = {}  # model key -> its ITL histogram child (labels() costs per call)
        self._speculated: dict[str, tuple[int, int]] = {}  # model -> (drafts, accepted tokens) since start
        self._phases_counted: dict[str, float] = {}  # the step clock's sums already added to STEP_PHASE

    def scheduled(self, request) -> None:
        """A choice of `request` leaves the waiting queue for prefill."""
        if request.request_id not in self._scheduled:
            self._scheduled.add(request.request_id)
            QUEUE.labels(label(request.model_name)).observe(time.monotonic() - request.arrived)

    def tokens(self, sequences, now: float | None = None) -> None:
        """Each of `sequences` just took one token (the output thread's, once per step). Rows whose last token
        came at the same moment (a batch's previous step) share one inter-token gap: observed once, counted
        for each."""
        now = time.monotonic() if now is None else now
        last_token = self._last_token
        teams: Tally = Tally()
        gaps: Tally = Tally()  # (model, when its last token came) -> rows
        for seq in sequences:
            request = seq.request
            teams[request.team] += 1
            key = id(seq)
            last = last_token.get(key)
            if last is not None:
                gaps[(request.model_name, last)] += 1
            elif request.request_id not in self._first_token:
                self._first_token.add(request.request_id)
                TTFT.labels(label(request.model_name)).observe(now - request.arrived)
                TEAM_TTFT.labels(team_label(request.team)).observe(now - request.arrived)
            last_token[key] = now
        for team, count in teams.items():
            TEAM_TOKENS.labels(team_label(team)).inc(count)
        for (model, last), count in gaps.items():
            itl = self._itl.get(model)
            if itl is None:
                itl = self._itl[model] = ITL.labels(label(model))
            observe_many(itl, now - last, count)

    @staticmethod
    def preempted(seq) -> None:
        TEAM_PREEMPTED.labels(team_label(seq.team)).inc()

    def teams(self, in_flight, waiting) -> None:
        """Each team's running and waiting sequences, after a step; gauges move on change."""
        counts: dict[str, tuple[int, int]] = {}
        running, queued = Tally(seq.team for seq in in_flight), Tally(seq.team for seq in waiting)
        for team in set(self._team_gauges) | set(running) | set(queued):
            counts[team] = (running[team], queued[team])
            if self._team_gauges.get(team) != counts[team]:
                TEAM_RUNNING.labels(team_label(team)).set(running[team])
                TEAM_WAITING.labels(team_label(team)).set(queued[team])
        self._team_gauges = counts

    def step(self, batch_size: int) -> None:
        if batch_size:
            BATCH_SIZE.observe(batch_size)

    def step_took(self, seconds: float) -> None:
        STEP.observe(seconds)

    def step_phases(self, clock) -> None:
        """The step clock's time by phase since the last call, onto `inference_step_phase_seconds`."""
        for phase, seconds in clock.seconds.items():
            added = seconds - self._phases_counted.get(phase, 0.0)
            if added > 0:
                STEP_PHASE.labels(phase).inc(added)
                self._phases_counted[phase] = seconds

    def finished(self, request, usage: dict) -> None:
        model = label(request.model_name)
        E2E.labels(model).observe(time.monotonic() - request.arrived)
        PROMPT_TOKENS.labels(model).inc(usage["prompt_tokens"])
        GENERATION_TOKENS.labels(model).inc(usage["completion_tokens"])
        first = request.sequences[0] if request.sequences else None  # a transcription has none
        reason = getattr(getattr(first, "output", None), "finish_reason", None) or getattr(first, "finish_reason", None)
        SUCCESS.labels(model, reason or "stop").inc()
        self.forget(request)

    def forget(self, request) -> None:
        """A request that ended (finished, cancelled or failed) leaves no state behind."""
        self._first_token.discard(request.request_id)
        self._scheduled.discard(request.request_id)
        for seq in request.sequences:
            self._last_token.pop(id(seq), None)

    def queues(self, requests, waiting) -> None:
        """Running and waiting request counts per model, after a step (or when idle); gauges move on change."""
        waiting_seqs = {id(seq) for seq in waiting}
        running, queued = Tally(), Tally()
        for request in requests:
            let_in = not request.sequences or any(id(seq) not in waiting_seqs and not seq.finished
                                                  for seq in request.sequences)  # a transcription runs at once
            (running if let_in else queued)[label(request.model_name)] += 1
        counts = {model: (running[model], queued[model]) for model in set(self._gauges) | set(running) | set(queued)}
        for model, (now_running, now_waiting) in counts.items():
            if self._gauges.get(model) != (now_running, now_waiting):
                RUNNING.labels(model).set(now_running)
                WAITING.labels(model).set(now_waiting)
        self._gauges = counts

    @staticmethod
    def kv_usage(runners) -> None:
        """Each model's share of its KV cache budget in use (`vllm:kv_cache_usage_perc`)."""
        for name, runner in runners.items():
            KV_USAGE.labels(label(name)).set(min(1.0, runner.kv_used() / max(1, runner.kv_budget.bytes)))
            PREEMPTIONS.labels(label(name))  # shown from 0

    @staticmethod
    def kv_preempted(model: str) -> None:
        PREEMPTIONS.labels(label(model)).inc()

    @staticmethod
    def prefix_lookup(model: str, queried: int, hit: int) -> None:
        PREFIX_CACHE_QUERIES.labels(label(model)).inc(queried)
        if hit:
            PREFIX_CACHE_HITS.labels(label(model)).inc(hit)

    def speculated(self, model: str, drafts: int, drafted: int, accepted: int) -> None:
        """A step's verified drafts (workers/engine/speculation/): vLLM's counters and the mean accepted length."""
        name = label(model)
        SPEC_DRAFTS.labels(name).inc(drafts)
        SPEC_DRAFT_TOKENS.labels(name).inc(drafted)
        SPEC_ACCEPTED.labels(name).inc(accepted)
        totals = self._speculated.get(name, (0, 0))
        totals = self._speculated[name] = (totals[0] + drafts, totals[1] + accepted)
        SPEC_MEAN_LENGTH.labels(name).set(1 + totals[1] / totals[0])

    @staticmethod
    def tensor_parallel_sent(model: str, messages: int, seconds: float) -> None:
        """Rank 0's op messages to a split model's followers since the last call, and their sending time."""
        TP_MESSAGES.labels(label(model)).inc(messages)
        TP_SEND.labels(label(model)).inc(seconds)

    @staticmethod
    def model_loaded(event: dict) -> None:
        """An on_model_event callback: a finished load's duration."""
        if event.get("type") == protocol.MODEL_LOADED and event.get("duration_s") is not None:
            MODEL_LOAD.labels(label(event["model"])).observe(event["duration_s"])
