"""The usage spool's segments against a replay running beside the writer (real files, real flocks): a new
segment is never claimable before its writer holds it, so no replay deletes a segment being opened."""
from __future__ import annotations

import threading

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
