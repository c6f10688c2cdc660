"""A follower replica (rank > 0) of a replicated run: ``python -m campaign.launch.follower``.

Started by :mod:`campaign.launch.replicated` with torchrun's variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the ledger URL in
``CAMPAIGN_LEDGER``. It reads from the ledger and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch

from campaign.host.processes import die_with_parent
from campaign.launch.replicated import RANK_OFFSET
from campaign.ledger import Ledger
from campaign.loop import replicas as dp
from campaign.loop.train import RunLoop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m campaign.launch.follower")
    parser.add_argument("run_id")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--slurm", action="store_true",
                        help="a task of a SLURM step: rank SLURM_PROCID + CAMPAIGN_RANK_OFFSET; "
                             "SIGUSR2 (the scheduler's warning) stops the run as on rank 0")
    parser.add_argument("--die-with-parent", action="store_true",
                        help="end with the process that started it (a Ray rank's task)")
    args = parser.parse_args(argv)
    if args.die_with_parent and not die_with_parent():
        return 1  # its starter is gone already
    if args.slurm:
        rank = int(os.environ["SLURM_PROCID"]) + int(os.environ.get(RANK_OFFSET, "1"))
        os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    replica = dp.Replica(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    preempt = (int(signal.SIGUSR2),) if args.slurm else ()
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with Ledger.open(ride_out=True) as ledger:  # a replica rides out an outage as its run does
        loop = RunLoop(ledger, args.run_id, artifacts=args.artifacts, device=args.device,
                       replica=replica, replay_in_subprocess=False, preempt_signals=preempt)
        with dp.process_group(replica, address, port, torch.device(args.device)):
            try:
                loop.setup()
                loop.train()
            finally:
                loop.cleanup()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Its work is written (the ledger closed, the group left): no interpreter teardown, where
    # a sharded run's communication threads abort the process ("terminate called without an
    # active exception") and SLURM would report the step's task as failed.
    os._exit(code)
