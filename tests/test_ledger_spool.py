"""The usage spool's segments (real files, real flocks): a new segment is never claimable before its writer
holds it, so no replay running beside the writer deletes a segment being opened; rows appended before a kill
-9 are all replayed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from teams.ledger_spool import Spool


def test_a_replay_beside_new_segments_never_takes_one_its_writer_is_opening(tmp_path):
    spool = Spool(tmp_path)
    stop, claimed, failures = threading.Event(), [], []

    def replay() -> None:  # what the ledger's replay does: claim what nobody holds, delete it
        while not stop.is_set():
            for path, rows in spool.claim_abandoned():
                claimed.append(path)
                path.unlink(missing_ok=True)

    replayer = threading.Thread(target=replay)
    replayer.start()
    try:
        for _ in range(3000):
            try:
                segment = spool._open()
            except OSError as exc:
                failures.append(exc)
                continue
            assert segment.path.exists()
            spool._close(segment)  # nothing written, nothing kept: deleted by its owner
    finally:
        stop.set()
        replayer.join()
    assert failures == [] and claimed == []
    assert list(tmp_path.iterdir()) == []  # no segment, and no staging file, left behind


SPOOL_CHILD = """
import os, signal, sys
from datetime import datetime, timezone
from teams.ledger import UsageEntry
from teams.ledger_spool import Spool

spool = Spool(sys.argv[1])
for number in range(int(sys.argv[2])):
    spool.append(UsageEntry(request_id=f"cmpl-{number}", created_at=datetime.now(timezone.utc), team_id=1,
                            key_id=None, user_id=None, model="m", endpoint="/v1/completions", prompt_tokens=4,
                            completion_tokens=number, time_to_first_token_ms=None, duration_ms=0, status_code=200,
                            finish_reason="length", cancelled=False, error_code=""))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("rows", [3, 2500])  # one segment; segments rotated (1,000 rows each)
def test_rows_appended_before_a_kill_9_are_all_replayed(tmp_path, rows):
    """A process killed with -9 right after appending (no flush, no close): its segments hold every row, the
    mapped files' unwritten rest is no row, and nothing is counted twice."""
    child = subprocess.run([sys.executable, "-c", SPOOL_CHILD, str(tmp_path), str(rows)],
                           cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "PYTHONPATH": "."},
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    replayed = [row for _, segment_rows in Spool(tmp_path).claim_abandoned() for row in segment_rows]
    assert sorted(row["completion_tokens"] for row in replayed) == list(range(rows))


def test_a_closed_kept_segment_holds_its_lines_only(tmp_path):
    """A segment closed with rows the database did not take is cut to its lines (read as text, as a person
    would): no zeros after them."""
    spool = Spool(tmp_path)
    segment = spool._open()
    segment.file.put(b'{"request_id": "cmpl-1"}\n')
    segment.rows = 1
    spool.settled(segment, 1, written=False)
    [path] = tmp_path.glob("usage-*.jsonl")
    assert path.read_bytes() == b'{"request_id": "cmpl-1"}\n'


def test_a_segment_holds_its_disk_blocks_from_the_start(tmp_path):
    """A mapped page the disk cannot back kills the process at the copy (SIGBUS): a segment reserves its blocks
    when it is made, so a full disk fails the opening with an OSError instead."""
    from teams.ledger_spool import SEGMENT_BYTES

    segment = Spool(tmp_path)._open()
    try:
        assert os.stat(segment.path).st_blocks * 512 >= SEGMENT_BYTES
    finally:
        segment.file.close(delete=True)
