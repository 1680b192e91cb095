"""The admin's usage report: tokens per day by team, key or model, as a server-drawn SVG chart and CSV,
and per team over a window (the last `days`, or the last `minutes`): requests served and refused,
tokens, and the part of all tokens each team got beside the part its `share` weight asks for."""
from __future__ import annotations

import csv
import datetime as dt
from collections import defaultdict

from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from .models import UsageRecord
from .selectors import usage_by_day, usage_by_team

GROUPS = {"team": lambda row: row["team__name"] or "(none)",
          "key": lambda row: f"{row['key__name']} ({row['key__prefix']}…)" if row["key__prefix"] else "(session)",
          "model": lambda row: row["model"]}
COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
CSV_COLUMNS = ("day", "team", "key", "model", "requests", "refused", "prompt_tokens", "completion_tokens",
               "total_tokens")
WIDTH, HEIGHT, MARGIN = 720, 240, 40


def _filters(params) -> dict:
    filters = {}
    for name, lookup in (("team", "team__name"), ("key", "key__prefix"), ("model", "model")):
        if params.get(name):
            filters[lookup] = params[name]
    return filters


def _days(params) -> int:
    try:
        return min(366, max(1, int(params.get("days", 30))))
    except ValueError:
        return 30


def chart(rows: list[dict], group: str, days: int) -> dict:
    """Stacked bars of total tokens per day, one colour per team/key/model."""
    today = timezone.now().date()
    dates = [today - dt.timedelta(days=offset) for offset in range(days - 1, -1, -1)]
    totals: dict[tuple, int] = defaultdict(int)
    series: list[str] = []
    for row in rows:
        name = GROUPS[group](row)
        if name not in series:
            series.append(name)
        totals[(row["day"], name)] += (row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)
    peak = max([sum(totals[(d, s)] for s in series) for d in dates] + [1])
    slot = (WIDTH - MARGIN) / len(dates)
    bars = []
    for i, day in enumerate(dates):
        bottom = HEIGHT - MARGIN
        for j, name in enumerate(series):
            value = totals[(day, name)]
            if not value:
                continue
            height = value / peak * (HEIGHT - 2 * MARGIN)
            bottom -= height
            bars.append({"x": MARGIN + i * slot + 1, "y": bottom, "width": max(1.0, slot - 2), "height": height,
                         "colour": COLOURS[j % len(COLOURS)], "title": f"{day}: {name}: {value} tokens"})
    return {"bars": bars, "width": WIDTH, "height": HEIGHT, "peak": peak, "axis_y": HEIGHT - MARGIN,
            "margin": MARGIN, "first": dates[0], "last": dates[-1],
            "legend": [{"name": s, "colour": COLOURS[j % len(COLOURS)]} for j, s in enumerate(series)]}


def csv_response(rows: list[dict]) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="usage.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        prompt, completion = row["prompt_tokens"] or 0, row["completion_tokens"] or 0
        writer.writerow([row["day"], row["team__name"] or "", row["key__prefix"] or "", row["model"], row["requests"],
                         row["refused"], prompt, completion, prompt + completion])
    return response


def _minutes(params) -> int | None:
    try:
        return min(366 * 1440, max(1, int(params["minutes"]))) if params.get("minutes") else None
    except ValueError:
        return None


def usage_report_view(request):
    params = request.GET
    days, group = _days(params), params.get("group") if params.get("group") in GROUPS else "team"
    rows = usage_by_day(days, **_filters(params))
    minutes = _minutes(params)
    window = dt.timedelta(minutes=minutes) if minutes else dt.timedelta(days=days)
    if params.get("format") == "csv":
        return csv_response(rows)
    return TemplateResponse(request, "admin/teams/usage_report.html", {
        "title": "Usage per day", "opts": UsageRecord._meta, "rows": rows, "chart": chart(rows, group, days),
        "group": group, "groups": list(GROUPS), "days": days, "params": params.urlencode(),
        "filters": {name: params.get(name, "") for name in ("team", "key", "model")},
        "total_tokens": sum((r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0) for r in rows),
        "teams": usage_by_team(timezone.now() - window), "minutes": minutes or "",
        "window": f"{minutes} minutes" if minutes else f"{days} days",
    })
