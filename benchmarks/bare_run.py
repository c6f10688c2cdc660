"""The yardstick of ``campaign run``: what a hand-written script does for the same 100 updates
of the ``campaign init`` skeleton, and nothing more.

    python benchmarks/bare_run.py SKELETON_DIR [UPDATES]

It imports torch and the skeleton's task, builds the same model, trains 100 updates of 2 x 8
examples with AdamW, saves the weights with safetensors, and compares the reloaded model's
outputs on the validation examples in a forked child (the replay a campaign run also does).
``UPDATES`` 1 is the floor of a launch's first update (``launch_start.py``): the same process
stops after its first update, with nothing saved or replayed.
"""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, sys.argv[1])
import study_task


def main(folder: str, updates: int = 100) -> int:
    torch.manual_seed(0)
    task = study_task.build({"task": {"hidden": 16}, "seed": 0})
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
    if updates == 1:
        return 0
    path = os.path.join(folder, "bare-final.safetensors")
    save_file(model.state_dict(), path)
    with torch.no_grad():
        expected = task.outputs(model, task.collate(val))
    child = os.fork()
    if child == 0:  # the replay: reload from disk in a forked child and compare
        replayed = task.model()
        replayed.load_state_dict(load_file(path))
        with torch.no_grad():
            os._exit(0 if torch.equal(task.outputs(replayed, task.collate(val)), expected) else 1)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(int(n) for n in sys.argv[2:3])))
