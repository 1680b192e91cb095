"""One batch line through the endpoints' own pipeline: the view's serializer, model resolution, the
team's meter (limits, reservation, ledger row) and the same answer body, at `batch` priority.

A line's refusal or failure becomes its output line's `response` (status and OpenAI error body), as
the endpoint would have answered it; what is worth waiting out (a rate limit, no worker, a lost
worker) is tried again until the batch ends.

The ledger rows of the try that gives the line its result travel with that result and are written in
the same transaction (`state.record_lines`): a process killed between a line's end and its record
leaves neither, and the line, run again, is counted once. Rows of tries waited out, and of a line
stopped (a cancel, a takeover), go to the ledger writer at once.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import replace

from teams.ledger import LedgerWriter, UsageEntry
from teams.metering import RequestMeter
from teams.principal import Principal

from ..chat import ChatCompletionsView
from ..completions import CompletionsView
from ..embeddings import EmbeddingsView
from ..errors import exception_handler
from ..response_views import ResponsesView

logger = logging.getLogger(__name__)
VIEWS = {"/v1/completions": CompletionsView, "/v1/chat/completions": ChatCompletionsView,
         "/v1/responses": ResponsesView, "/v1/embeddings": EmbeddingsView}
MAX_WAIT = 30.0  # seconds between tries, at most
MAX_TRIES = 60  # a line refused this often (503s, rate limits) goes to the error file as it was last answered


def batch_principal(principal: Principal) -> Principal:
    """The caller as a batch line counts: against the team's tokens and budget, not its requests per
    minute or parallel slots (the runner's own concurrency bounds those)."""
    scopes = tuple(replace(scope, rpm=None, max_parallel=None) for scope in principal.scopes)
    return replace(principal, scopes=scopes)


async def answer(principal: Principal, url: str, body: dict) -> tuple[int, str, dict, list[UsageEntry]]:
    """(status, request id, body, its ledger rows, not yet written) of one request made as the endpoint
    would answer it, never streamed."""
    view = VIEWS[url]()
    meters: list[RequestMeter] = []

    def meter_for(request_id: str) -> RequestMeter:
        meters.append(RequestMeter(principal, url, request_id, hold_row=True))
        return meters[-1]

    def rows() -> list[UsageEntry]:
        return [meter.row for meter in meters if meter.row is not None]

    try:
        whole = {**body, "stream": False} if "stream" in view.serializer_class._declared_fields else body
        job = await view.start(view.validated(whole), meter_for, priority_class="batch")
        if job.early is not None:
            return 200, job.request_id, job.early, rows()
        whole = await view.whole_body(job.serializer, job.request_id, job.model, job.stream)
        return 200, job.request_id, whole, rows()
    except asyncio.CancelledError:
        record_now(rows())
        raise
    except Exception as exc:
        response = exception_handler(exc, {})
        request_id = meters[-1].request_id if meters else f"batch_req_{secrets.token_hex(12)}"
        return response.status_code, request_id, dict(response.data), rows()


def record_now(rows: list[UsageEntry]) -> None:
    """Rows that no line's result carries, to the ledger writer (spooled first: never lost)."""
    for row in rows:
        LedgerWriter.get().record(row)


async def run_line(principal: Principal, url: str, custom_id: str, body: dict) -> tuple[dict, bool, list[UsageEntry]]:
    """(the output line, whether it goes to the error file, the ledger rows to write with it); waits
    out what passes and tries again."""
    wait = 1.0
    for tries in range(1, MAX_TRIES + 1):
        status, request_id, answer_body, rows = await answer(principal, url, body)
        code = (answer_body.get("error") or {}).get("code") if status >= 400 else None
        passing = status == 503 or (status == 429 and code == "rate_limit_exceeded")
        if passing and tries < MAX_TRIES:
            record_now(rows)
            logger.info("batch line %s: %s (%s), trying again in %.0fs", custom_id, status, code, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, MAX_WAIT)
            continue
        line = {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": custom_id,
                "response": {"status_code": status, "request_id": request_id, "body": answer_body}, "error": None}
        return line, status >= 400, rows
    raise AssertionError("unreachable")
