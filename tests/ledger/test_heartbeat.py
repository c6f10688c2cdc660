"""The heartbeat thread: a refused beat stops the run, an unreachable database is retried, and a
defect in a beat is handed to the loop instead of being swallowed."""

from __future__ import annotations

import threading

import pytest

from campaign.errors import LedgerUnreachable, RefusedWrite
from campaign.loop.heartbeat import Heartbeat


def _beating(answers: list[object]) -> tuple[Heartbeat, threading.Event]:
    """A heartbeat whose beats give ``answers`` in turn (an exception is raised); ``done`` is
    set once every answer was given."""
    done = threading.Event()
    remaining = list(answers)

    def beat() -> bool:
        answer = remaining.pop(0)
        if not remaining:
            done.set()
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer)

    return Heartbeat(beat, 0.01, "test-heartbeat"), done


def test_unreachable_is_retried_and_a_refusal_means_the_lease_is_gone() -> None:
    heartbeat, done = _beating([True, LedgerUnreachable("down"), True, RefusedWrite("gone")])
    heartbeat.start()
    assert done.wait(5)
    assert heartbeat.lease_lost.wait(5)
    heartbeat.stop()
    heartbeat.check()  # nothing to re-raise


def test_a_defect_in_a_beat_reaches_the_loop() -> None:
    heartbeat, done = _beating([True, TypeError("a bug in the beat")])
    heartbeat.start()
    assert done.wait(5)
    heartbeat.stop()
    assert not heartbeat.lease_lost.is_set()
    with pytest.raises(RuntimeError, match="the heartbeat failed: TypeError"):
        heartbeat.check()
