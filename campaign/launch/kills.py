"""A run's process killed by a signal its supervisor did not send: an event, not a verdict.

The kernel's OOM killer or an operator's ``kill -9`` ends the process without a word. That
says nothing about the run's configuration, and a ``failed`` run loses its seed from the
conclusion for good, so the supervisor ends it ``interrupted`` with the cause ``killed``:
resumable from its last verified checkpoint like a preempted run (same id, new segment).
Only a second kill at the same update is a verdict (``failed``/``killed``, both kills in
its detail): the run itself is what dies there. Each kill is recorded as a ``killed`` event
(``update N: how``), which is what the second kill is counted from (docs/runs.md, faults).
A crash the process raises on itself (SIGSEGV, SIGBUS, SIGABRT, ...) is the run's own failure
and stays ``failed``/``exception``.

Whether the kernel's OOM killer did it is read from this process's memory cgroup (v2
``memory.events``, v1 ``memory.oom_control``, both ``oom_kill``): the run's process is in its
supervisor's cgroup, so a count that grew while the run ran names the OOM killer, and the
detail sets the campaign pilot's host-memory peak beside it (what the run was measured to
need); without a readable count the detail says only the signal.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from campaign.host.processes import signal_name
from campaign.ledger import Claim, Ledger, LedgerError
from campaign.loop import progress_page

KILLED_EVENT = "killed"  # one per kill: "update N: how"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills() -> int | None:
    """The OOM killer's count in this process's memory cgroup, None when it cannot be read."""
    groups = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            groups[controllers] = path.lstrip("/")
    places = []
    if "memory" in groups:  # cgroup v1: the memory controller's own hierarchy
        places.append(CGROUP_ROOT / "memory" / groups["memory"] / "memory.oom_control")
    if "" in groups:  # cgroup v2 (unified), at the root or beside v1
        for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
            places.append(root / groups[""] / "memory.events")
    for place in places:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            return int(next(x.split()[1] for x in place.read_text().splitlines()
                            if x.startswith("oom_kill ")))
    return None


def pilot_host_peak(ledger: Ledger, campaign: str) -> int | None:
    """The highest host memory (RSS) the campaign's pilots measured, in bytes, if any did."""
    with contextlib.suppress(LedgerError, KeyError):
        phases = ledger.phases(campaign)
        peaks = phases.loc[phases["pilot_id"].notna(), "rss_peak"].dropna()
        return int(peaks.max()) if not peaks.empty else None
    return None


def how_killed(exitcode: int, host_gone: bool, oom_before: int | None) -> str:
    """What the supervisor saw, in words, and nothing it did not see."""
    if host_gone:
        return "died with its task host (which was killed or ended)"
    how = f"was killed by {signal_name(-exitcode)}"
    after = oom_kills()
    if oom_before is not None and after is not None and after > oom_before:
        how += " from the kernel's OOM killer (memory.events oom_kill grew while it ran)"
    return how + ", a signal its supervisor did not send"


def earlier_kills(ledger: Ledger, claim: Claim) -> list[int]:
    """The updates at which this run was killed before (its ``killed`` events)."""
    events = ledger.events(ledger.run(claim.run_id).campaign, run_id=claim.run_id)
    steps = []
    for detail in events.loc[events["kind"] == KILLED_EVENT, "detail"]:
        with contextlib.suppress(ValueError, IndexError):
            steps.append(int(str(detail).split(":", 1)[0].removeprefix("update ")))
    return steps


def last_checkpoint(ledger: Ledger, claim: Claim) -> int | None:
    """The update of the run's last recorded (verified at its write) checkpoint, or None."""
    artifacts = ledger.artifacts(ledger.run(claim.run_id).campaign)
    mine = artifacts[(artifacts["run_id"] == claim.run_id) & (artifacts["kind"] == "checkpoint")]
    return None if mine.empty else int(mine["step"].max())


def killed_end(ledger: Ledger, claim: Claim, how: str, seen: progress_page.Progress,
               subject: str = "the run's process") -> tuple[str, str]:
    """Record this kill and say how the run ends: (status, detail). ``interrupted`` unless it
    was killed at this update before. ``subject``: what ``how`` is said of (a run's other
    rank: "the run's" + "rank 1 (pid 7) was killed by SIGKILL")."""
    before = [step for step in earlier_kills(ledger, claim) if step == seen.step]
    if "OOM killer" in how:  # what the run was measured to need, beside what killed it
        peak = pilot_host_peak(ledger, ledger.run(claim.run_id).campaign)
        how += (f" (its pilot's host-memory peak: {peak / 2**30:.2f} GiB)" if peak is not None
                else " (no pilot measured its host memory)")
    ledger.add_event(ledger.run(claim.run_id).campaign, KILLED_EVENT,
                     f"update {seen.step}: {subject} {how} in {seen.phase}",
                     run_id=claim.run_id, lease=claim.lease)
    where = f"{subject} {how} in {seen.phase} after update {seen.step}"
    if before:
        return "failed", (f"{where}, the second time at this update (its killed events): the "
                          "run itself is what dies here; relaunch it with less memory or look "
                          "at its log")
    checkpoint = last_checkpoint(ledger, claim)
    resume = (f"its last checkpoint is at update {checkpoint}" if checkpoint is not None
              else "it has no checkpoint yet and starts again from update 0")
    return "interrupted", (f"{where}; {resume}: `campaign resume {claim.run_id}` (or "
                           "`campaign launch CAMPAIGN --resume-interrupted`) continues it")
