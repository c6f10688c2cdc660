"""The software stack of this process: what a run records, what launch and doctor compare.

Kept out of the training loop: the launch gate, the pilot and ``doctor`` describe
or compare stacks without training. torch is imported when a stack is described
(its version, CUDA and devices are part of it), never when this module loads.
"""

from __future__ import annotations

import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from campaign.stack import project, provenance

# What must match between the pilot's machine and a launching one for the pilot to speak for it.
STACK_KEYS = ("torch", "cuda", "cudnn", "devices", "python")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
PACKAGES = ("campaign", "numpy", "safetensors", "sqlalchemy", "pandas", "scikit-learn")


def environment(task_reference: str | None) -> dict[str, Any]:
    """The software stack of this process, recorded with every run and pilot."""
    import torch

    cuda = torch.cuda.is_available()
    installed = provenance.distributions()
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    stack: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "devices": devices if cuda else ["cpu"],
        "python": platform.python_version(),
        "host": socket.gethostname(),
        # From the dist-info folders' names, read once: METADATA parsed for each package took
        # 8 ms of every run's start (a run is a fresh child, so no cache outlives it).
        "packages": {name: installed.get(name) for name in PACKAGES},
        "threads": thread_settings(),
    }
    if task_reference is not None:
        stack["task"] = task_reference
        git = provenance.git_state(task_reference)
        stack["git_revision"] = git["revision"] if git else None  # the short form, kept
        stack["git"] = git
        stack["task_source"] = provenance.task_source(task_reference)
    stack["working_directory"] = provenance.working_directory()
    stack["distributions"] = installed
    return stack


def run_environment(task_reference: str, excluded: list[Path]) -> dict[str, Any]:
    """A run's record of its stack once its task is built: :func:`environment`, whose task
    source holds the local modules the task imported, and the files it read under the
    working folder but outside ``excluded`` (:mod:`campaign.stack.project`)."""
    stack = environment(task_reference)
    stack["task_reads"] = project.files_read(Path(stack["working_directory"]), excluded)
    return stack


def late_inputs(stack: Mapping[str, Any], excluded: list[Path]) -> dict[str, Any] | None:
    """What the task imported and read after ``stack`` was recorded (a lazy dataset's files,
    an import inside ``loss``), for the run's ``inputs_late`` event; None when nothing."""
    task, folder = stack.get("task"), stack.get("working_directory")
    if not isinstance(task, str) or not isinstance(folder, str):
        return None
    recorded = stack.get("task_source")
    source = provenance.task_source(task, after=recorded) if recorded else None
    known = {read["path"] for read in stack.get("task_reads") or []}
    reads = [r for r in project.files_read(Path(folder), excluded) if r["path"] not in known]
    if source is None and not reads:
        return None
    return {"task_source": source, "task_reads": reads}


def thread_settings() -> dict[str, Any]:
    """torch's intra- and inter-op thread counts and the settings they come from: the last
    float32 bit of a reduction can depend on them, so every segment records them."""
    import os

    import torch

    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
            **{name: os.environ.get(name) for name in THREAD_VARIABLES}}


def stack_differences(pilot: Mapping[str, Any] | None, current: Mapping[str, Any],
                      was: str = "pilot") -> list[str]:
    """What differs between the pilot's software stack (or another recorded one, ``was``
    naming it) and this one: for a launch to warn, for a reproduction that differs."""
    if not pilot:
        return [f"no stack recorded with the {was}"]
    return [
        f"{key}: {was} {pilot.get(key)!r}, now {current.get(key)!r}"
        for key in STACK_KEYS
        if pilot.get(key) != current.get(key)
    ]
