"""The pilot's fresh-process resume check: ``python -m campaign.pilot.resume_check CKPT TASK``.

Loads the pilot's checkpoint into a new interpreter, runs the next update and
prints what it restored (step, learning rate, data position, an RNG draw) and
the next update's loss, for the pilot to compare with the process that saved it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from campaign.host.calls import answer
from campaign.loop import checkpoint as ckpt
from campaign.loop.task import build_task
from campaign.pilot.session import PilotSession


def main(path: str, task_reference: str) -> None:
    tensors, state = ckpt.load(Path(path), None)
    config = state["config"]
    session = PilotSession(build_task(task_reference, config), config, torch.device("cpu"))
    session.restore(tensors, state)
    report = session.fingerprint()
    report["next_loss"] = session.update()[0]
    if not answer(report):  # through the answer file: a task's prints cannot corrupt it
        print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
