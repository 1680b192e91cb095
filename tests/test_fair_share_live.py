"""Teams sharing one box, through the real server: a flood from one team does not make another wait,
shares weigh the tokens, and a batch key's work gives way to interactive work.

Four slots (INFERENCE_MAX_NUM_SEQS=4) make the box full with a handful of streams.
"""
from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
from openai import AsyncOpenAI

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .teams_setup import make_teams


@pytest.fixture(scope="module")
def box(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("fair-share-server")
    env = base_env(hf_cache, work, INFERENCE_MAX_NUM_SEQS="4", INFERENCE_WORKER_ACK_TIMEOUT="120")
    server = LiveServer(env, work)
    server.secrets = make_teams(env, teams={"flood": [], "quiet": [], "heavy": ["--share", "3"], "light": []},
                                keys={"flood": ["--team", "flood"], "quiet": ["--team", "quiet"],
                                      "heavy": ["--team", "heavy"], "light": ["--team", "light"],
                                      "nightly": ["--team", "flood", "--service-tier", "batch"]})
    yield server
    server.stop()


def client(server: LiveServer, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.secrets[key], max_retries=0, timeout=300)


async def complete(api: AsyncOpenAI, prompt: str, max_tokens: int) -> float:
    """When (monotonic) the whole answer had come."""
    answer = await api.completions.create(model=TINY_MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == max_tokens
    return time.monotonic()


def team_series(server: LiveServer, name: str) -> dict[str, float]:
    """One per-team series of /metrics (e.g. `inference_team_generation_tokens_total`), by team."""
    text = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {server.key}"}, timeout=30).text
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(rf'^{re.escape(name)}\{{team="([^"]*)"\}} ([0-9.e+]+)$', text, re.M)}


def team_tokens(server: LiveServer) -> dict[str, float]:
    return team_series(server, "inference_team_generation_tokens_total")


async def until_waiting(server: LiveServer, teams: tuple[str, ...], timeout: float = 30.0) -> None:
    """Until every team in `teams` has sequences waiting in the engine (its requests have all come in)."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = await asyncio.to_thread(team_series, server, "inference_team_sequences_waiting")
        if all(waiting.get(team, 0) > 0 for team in teams):
            return
        assert time.monotonic() < deadline, f"not every team's work waits: {waiting}"
        await asyncio.sleep(0.05)


def test_a_flood_does_not_make_another_team_wait(box):
    async def scenario():
        flood, quiet = client(box, "flood"), client(box, "quiet")
        await complete(quiet, "warm", 1)
        floods = [asyncio.create_task(complete(flood, f"Flood {i}: once upon a time", 400)) for i in range(12)]
        await asyncio.sleep(0.3)  # four rows running, eight queued
        quiet_done = await complete(quiet, "One quick question", 8)
        return quiet_done, await asyncio.gather(*floods)

    quiet_done, flood_done = asyncio.run(scenario())
    # First come first served would put the quiet team's request behind the eight queued ones.
    assert sum(done > quiet_done for done in flood_done) >= 10, (quiet_done, sorted(flood_done))


def test_two_flooding_teams_get_tokens_by_their_shares(box):
    """heavy (share 3) and light (share 1) flood together: while both have work waiting, heavy gets about
    three quarters of the tokens (once one team runs out, the other gets the whole box: not measured)."""
    async def scenario():
        heavy, light = client(box, "heavy"), client(box, "light")
        await asyncio.gather(complete(heavy, "warm", 1), complete(light, "warm", 1))
        tasks = [asyncio.create_task(complete(api, f"{name} {i}: the story goes", 400))
                 for i in range(16) for name, api in (("heavy", heavy), ("light", light))]
        await until_waiting(box, ("heavy", "light"))  # the window ends long before either runs out
        before = await asyncio.to_thread(team_tokens, box)
        await asyncio.sleep(1.0)
        after = await asyncio.to_thread(team_tokens, box)
        await asyncio.gather(*tasks)
        return {team: after.get(team, 0) - before.get(team, 0) for team in ("heavy", "light")}

    served = asyncio.run(scenario())
    heavy_part = served["heavy"] / (served["heavy"] + served["light"])
    assert 0.6 <= heavy_part <= 0.9, served


def test_a_batch_keys_work_gives_way_to_interactive_work(box):
    async def scenario():
        nightly, quiet = client(box, "nightly"), client(box, "quiet")
        await complete(nightly, "warm", 1)
        batch = [asyncio.create_task(complete(nightly, f"Nightly {i}: once upon a time", 400)) for i in range(4)]
        await asyncio.sleep(0.3)  # the batch key fills every slot
        quiet_done = await complete(quiet, "Interactive question", 8)
        return quiet_done, await asyncio.gather(*batch)

    quiet_done, batch_done = asyncio.run(scenario())
    assert all(done > quiet_done for done in batch_done), (quiet_done, batch_done)
