"""`GET /metrics`: Prometheus text for the whole deployment, for a bearer key or an allow-listed address.

What it shows: the engine's vLLM-named metrics (workers.engine.core.metrics), HTTP requests by route and
status (counted by the ASGI guard through `observe_http`), and from the catalog, which every
web and worker process shares: workers by status, the models loaded on live workers and whether each is
degraded there (most of its recent requests failed), with its recent failures.
With PROMETHEUS_MULTIPROC_DIR set (several processes on one host), the values of every process
writing there are merged, as prometheus-client's multiprocess mode does.
"""
from __future__ import annotations

import os

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from rest_framework.permissions import BasePermission

from teams.client_address import in_networks, parse_networks, request_client_address
from teams.principal import Principal

from .base import OpenAIView

HTTP_REQUESTS = Counter("inference_http_requests", "HTTP requests by route, method and status.",
                        ["endpoint", "method", "status"])
HTTP_LATENCY = Histogram("inference_http_request_duration_seconds", "Time to the end of the response, by route.",
                         ["endpoint"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))


def observe_http(endpoint: str, method: str, status: int, seconds: float) -> None:
    HTTP_REQUESTS.labels(endpoint, method if method in KNOWN_METHODS else "other", str(status)).inc()
    HTTP_LATENCY.labels(endpoint).observe(seconds)


KNOWN_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT"}


class CatalogCollector:
    """Workers by status, loaded models and their recent failures, read from the catalog at scrape time."""

    def collect(self):
        from catalog.models import ModelLoad, Worker
        from catalog.selectors import live_workers

        alive = live_workers()
        workers = GaugeMetricFamily("inference_workers", "Workers in the catalog by status (online: alive now).",
                                    labels=["status"])
        counts = {status: 0 for status in Worker.Status.values}
        for status in Worker.objects.values_list("status", flat=True):
            counts[status] = counts.get(status, 0) + 1
        counts[Worker.Status.ONLINE] = len(alive)
        for status, count in sorted(counts.items()):
            workers.add_metric([status], count)
        yield workers
        labels = ["model_name", "worker"]
        loaded = GaugeMetricFamily("inference_model_loaded", "1 for each model loaded on a live worker.", labels=labels)
        degraded = GaugeMetricFamily("inference_model_degraded", "1 for a loaded model failing most of its recent "
                                     "requests on that worker (0: not).", labels=labels)
        failed = GaugeMetricFamily("inference_model_recent_failures", "Of a loaded model's last requests on that "
                                   "worker (inference_model_recent_requests), how many failed.", labels=labels)
        counted = GaugeMetricFamily("inference_model_recent_requests", "A loaded model's last requests on that worker "
                                    "that its health counts (at most 10).", labels=labels)
        rows = (ModelLoad.objects.filter(worker__in=alive, status=ModelLoad.Status.LOADED)
                .values_list("model__repo_id", "worker__name", "degraded", "recent_failed", "recent_jobs"))
        for repo_id, worker, is_degraded, recent_failed, recent_jobs in rows:
            loaded.add_metric([repo_id, worker], 1)
            degraded.add_metric([repo_id, worker], int(is_degraded))
            failed.add_metric([repo_id, worker], recent_failed)
            counted.add_metric([repo_id, worker], recent_jobs)
        yield from (loaded, degraded, failed, counted)


def exposition() -> bytes:
    """The scrape body: this process (or every process of the multiprocess dir), then the catalog."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    catalog = CollectorRegistry()
    catalog.register(CatalogCollector())
    return generate_latest(registry) + generate_latest(catalog)


def metrics_networks() -> tuple:
    return parse_networks(settings.INFERENCE.api.metrics_allow)


class KeyOrAllowedAddress(BasePermission):
    """A valid bearer key, or a client address in INFERENCE_METRICS_ALLOW (Prometheus needs no key there);
    behind a trusted proxy the client's, never the proxy's."""

    def has_permission(self, request, view) -> bool:
        if not settings.INFERENCE.teams.auth_enabled or isinstance(request.auth, Principal):
            return True
        return in_networks(request_client_address(request._request), metrics_networks())


class MetricsView(OpenAIView):
    permission_classes = [KeyOrAllowedAddress]

    async def get(self, request):
        body = await sync_to_async(exposition)()
        return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
