"""The digits task with a fault injected at the N-th training microbatch (stop-cause tests)."""

from __future__ import annotations

import inspect
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from campaign.tasks.digits import DigitsTask


class FaultyDigits(DigitsTask):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.fault = config["task"].get("fault")
        self.config_task = dict(config["task"])
        self.at = int(config["task"].get("at", 3))
        self.sleep = float(config["task"].get("sleep", 0.0))
        self.marker = config["task"].get("marker")
        self.config_signal = str(config["task"].get("signal", "SIGTERM"))
        self.sleep_lock = float(config["task"].get("lock_s", 0.0))
        self.calls = 0
        self.jitter = random.Random(0)  # the same stalls in every process
        # Killed while building the model (the setup of a segment) once this file exists.
        self.setup_kill = config["task"].get("setup_kill_after")

    def model(self) -> torch.nn.Module:
        """In the process whose id CAMPAIGN_TEST_DRIFT names, the class scores are rolled by
        one: task code that behaves differently in another process, so the final artifact's
        replay in a fresh process predicts other labels."""
        model = super().model()
        if self.setup_kill and os.path.exists(self.setup_kill) and os.environ.get(
                "CAMPAIGN_SUPERVISOR_PID"):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "rank_drift" and os.environ.get("RANK") == "1":  # seeds by rank, say
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)
        drifting = os.environ.get("CAMPAIGN_TEST_DRIFT")  # the test's process or the run it
        supervisor = os.environ.get("CAMPAIGN_SUPERVISOR_PID")  # supervises (not a replay)
        replaying = any(frame.function == "replay_artifact" for frame in inspect.stack())
        if drifting and drifting in (str(os.getpid()), supervisor) and not replaying:
            model.register_forward_hook(lambda _m, _i, output: output.roll(1, dims=-1))
        return model

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        self.calls += model.training  # training calls only: "at" counts microbatches
        if self.sleep:
            time.sleep(self.sleep)
        if self.fault == "jitter" and model.training:  # a busy machine: some calls stall
            time.sleep(0.25 if self.jitter.random() < 0.3 else 0.0)
        total, units = super().loss(model, batch)
        title_file = self.config_task.get("title_to")  # what ps shows for this process
        if title_file and not os.path.exists(title_file):
            with open("/proc/self/cmdline", "rb") as shown, open(title_file, "wb") as out:
                out.write(shown.read())
        if self.calls >= self.at and model.training:
            if self.fault == "nan":
                total = total * float("nan")
            elif self.fault == "inf_grad":  # finite loss, infinite gradient
                weight = next(model.parameters())
                total = total + torch.sqrt(torch.zeros(()) + 0.0 * weight.sum())
            elif self.fault == "raise":
                raise RuntimeError("injected failure in the task's loss")
            elif self.fault == "sigterm" and self.marker and not os.path.exists(self.marker):
                open(self.marker, "w").close()  # once: the resumed process runs on
                os.kill(os.getpid(), signal.SIGTERM)
            elif self.fault == "selfkill" and not (self.marker and os.path.exists(self.marker)):
                if self.marker:  # once per marker; without one, at this update every time
                    open(self.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does: no word
            elif self.fault == "sigkill" and self.marker and not os.path.exists(self.marker):
                open(self.marker, "w").close()  # dies without a word, like a lost machine:
                supervisor = os.environ.get("CAMPAIGN_SUPERVISOR_PID")  # the worker with it
                os.kill(int(supervisor) if supervisor else os.getpid(), signal.SIGKILL)
                time.sleep(60)
            elif self.fault == "signal_tree" and self.marker and not os.path.exists(self.marker):
                open(self.marker, "w").close()  # as SLURM signals a job step: every process
                signum = getattr(signal, self.config_signal)  # of the run's tree at once
                tree = [int(os.environ["CAMPAIGN_SUPERVISOR_PID"]), os.getppid(), os.getpid()]
                for pid in tree:  # the supervisor, the task host, the run's own process
                    os.kill(pid, signum)
            elif self.fault == "disk_full" and self.marker and not os.path.exists(self.marker):
                open(self.marker, "w").close()  # once: this process writes no file over 4 KiB
                import resource  # (EFBIG, as ENOSPC on a full volume: no more bytes taken)

                resource.setrlimit(resource.RLIMIT_FSIZE,
                                   (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            elif self.fault == "ledger_lock" and self.marker and not os.path.exists(self.marker):
                hold_ledger_lock(os.environ["CAMPAIGN_LEDGER"], self.sleep_lock, self.marker)
            elif (self.fault == "hog" and os.environ.get("CAMPAIGN_TEST_HOG") and self.marker
                  and not os.path.exists(self.marker)):
                open(self.marker, "w").close()  # once, in a memory cgroup: takes host memory
                hoard = []  # until the kernel's OOM killer kills the process (at most 8 GiB:
                for _ in range(128):  # a test without its cgroup must not take the machine)
                    hoard.append(torch.ones(64 * 2**20 // 4))  # 64 MiB, written
                raise MemoryError("the hog fault took 8 GiB and was not killed")
            elif self.fault == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.fault == "val_oom" and not model.training and int(units) > self.at:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory in a batch of {int(units)}")
        return total, units


    def predict(self, model: torch.nn.Module, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """With ``task.fault = "sigkill_in_replay"``: the final artifact's replay (a child of
        the task host) kills the run's supervisor, the host's parent, once: a machine lost
        after the final artifact was written and recorded, before the run's end. With
        ``"killed_replays"``: the first ``task.at`` replays are killed (counted in the marker)."""
        replaying = any(frame.function == "replay_artifact" for frame in inspect.stack())
        if self.fault == "say_in_replay" and replaying:  # a task's print in its replay
            print(f"REPLAY-SAYS pid {os.getpid()}", flush=True)
        if self.fault == "killed_replays" and replaying and self.marker:
            counter = Path(self.marker)
            seen = int(counter.read_text() or 0) if counter.exists() else 0
            if seen < self.at:  # the first ``at`` replays die, as a job-wide signal kills them
                counter.write_text(str(seen + 1))
                os.kill(os.getpid(), signal.SIGKILL)
        if (self.fault == "sigkill_in_replay" and replaying and self.marker
                and not os.path.exists(self.marker)):
            open(self.marker, "w").close()
            with open(f"/proc/{os.getppid()}/stat") as stat:  # the host's parent
                supervisor = int(stat.read().rsplit(")", 1)[1].split()[1])
            os.kill(supervisor, signal.SIGKILL)
            time.sleep(60)  # the host and this child die with their owner
        return super().predict(model, batch)


def hold_ledger_lock(url: str, seconds: float, marker: str) -> None:
    """Another process takes the SQLite ledger's write lock and holds it ``seconds`` (a
    colleague's shell with an open transaction); returns once it holds it."""
    path = url.removeprefix("sqlite:///")
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); open(sys.argv[2], 'w').close(); "
            "time.sleep(float(sys.argv[3])); c.execute('ROLLBACK')")
    subprocess.Popen([sys.executable, "-c", code, path, marker, str(seconds)],
                     start_new_session=True)
    while not os.path.exists(marker):
        time.sleep(0.01)


def build(config: dict[str, Any]) -> FaultyDigits:
    return FaultyDigits(config)
