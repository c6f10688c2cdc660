"""The yardstick of ``campaign run``: what a hand-written script does for the same 100 updates
of the ``campaign init`` skeleton, and nothing more.

    python benchmarks/bare_run.py SKELETON_DIR [UPDATES]

It imports torch and the skeleton's task, builds the same model, trains 100 updates of 2 x 8
examples with AdamW, saves the weights with safetensors, and compares the reloaded model's
outputs on the validation examples in a forked child (the replay a campaign run also does).
The child is forked before any computation, as a campaign run's replay forks from a host that
never computed: forked after torch has run its OpenMP thread pool, a child can hang in its
first parallel region (GNU OpenMP does not survive a fork; seen here with two threads). The
child builds the task while the parent trains, as a campaign run's replay child does.
``UPDATES`` 1 is the floor of a launch's first update (``launch_start.py``): the same process
stops after its first update, with nothing saved or replayed.
"""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import load_file, save_file

if len(sys.argv) < 2 or not os.path.isfile(os.path.join(sys.argv[1], "study_task.py")):
    sys.exit("bare_run.py: give the folder of a `campaign init study` skeleton (study_task.py)")
sys.path.insert(0, sys.argv[1])
import study_task

CONFIG = {"task": {"hidden": 16}, "seed": 0}


def _replay(folder: str, saved: int) -> int:
    """Build the task and a new model while the parent trains (a campaign run's replay child
    does the same), wait for the parent's weights and outputs, reload the weights, and compare
    the outputs on the validation examples: 0 when they are equal bit for bit."""
    task = study_task.build(CONFIG)
    replayed = task.model()
    if not os.read(saved, 1):
        return 2  # the parent ended without saving
    replayed.load_state_dict(load_file(os.path.join(folder, "bare-final.safetensors")))
    expected = load_file(os.path.join(folder, "bare-outputs.safetensors"))["outputs"]
    with torch.no_grad():
        return 0 if torch.equal(task.outputs(replayed, task.collate(task.splits()["val"])),
                                expected) else 1


def _start_replay(folder: str) -> tuple[int, int]:
    """Fork the replay before anything is computed: its pid and the pipe that says saved."""
    saved, say_saved = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(say_saved)
        os._exit(_replay(folder, saved))
    os.close(saved)
    return child, say_saved


def main(folder: str, updates: int = 100) -> int:
    replay = _start_replay(folder) if updates > 1 else None
    torch.manual_seed(0)
    task = study_task.build(CONFIG)
    model = task.model()
    splits = task.splits()
    train, val = splits["train"], splits["val"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    position = 0
    for _ in range(updates):
        optimizer.zero_grad(set_to_none=True)
        total, units = 0.0, 0
        for _ in range(2):
            batch = task.collate([train[(position + i) % len(train)] for i in range(8)])
            position += 8
            loss, n = task.loss(model, batch)
            loss.backward()
            total, units = total + float(loss.detach()), units + n
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= units
        optimizer.step()
    if replay is None:
        return 0
    child, say_saved = replay
    save_file(model.state_dict(), os.path.join(folder, "bare-final.safetensors"))
    with torch.no_grad():
        expected = task.outputs(model, task.collate(val))
    save_file({"outputs": expected}, os.path.join(folder, "bare-outputs.safetensors"))
    os.write(say_saved, b"1")
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(int(n) for n in sys.argv[2:3])))
