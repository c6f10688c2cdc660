"""Facts about this machine's devices: whether a device name runs here, and which precision it
takes. Below the loop: a run refuses what the stack's gate refuses, with the same rule, and
the gate, doctor and a worker ask the same functions (docs/architecture.md, layers). torch is
imported when a device is asked about, never when this module loads.
"""

from __future__ import annotations

import os

from campaign.errors import DeviceUnavailable, LoopError


def precision_problem(precision: str, device: str) -> str | None:
    """Why ``precision`` cannot run on ``device`` (None when it can)."""
    if precision == "fp16" and not device.startswith("cuda"):
        return f"fp16 with a GradScaler needs a CUDA device, not {device}"
    if precision == "bf16" and device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():  # native bf16 from compute capability 8.0 (Ampere) on;
            index = int(device.split(":")[1]) if ":" in device else 0  # not emulation
            major, minor = torch.cuda.get_device_capability(index)
            if major < 8:
                return (f"{device} ({torch.cuda.get_device_name(index)}, capability "
                        f"{major}.{minor}) has no native bf16 (use fp16 or fp32)")
    return None


# Set by a SLURM array task's batch script: its tasks (a step of it sees only its own count).
# A run's ranks beyond rank 0 are then a step of their own, each with the devices SLURM gives.
SLURM_TASKS = "CAMPAIGN_SLURM_TASKS"


def ranks_problem(world: int, device: str, available: int | None = None) -> str | None:
    """Why ``world`` ranks of a run cannot each have their own device here (None: they can).
    On CUDA rank r takes the r-th device after ``device``'s own index; CPU ranks share the
    CPU. ``available``: the CUDA device count (asked of torch when not given)."""
    if world <= 1 or not device.startswith("cuda"):
        return None
    if int(os.environ.get(SLURM_TASKS) or 0) >= world:
        return None  # its other ranks are a SLURM step, each with the devices SLURM gave it
    if available is None:
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.split(":")[1]) if ":" in device else 0
    if index + world <= available:
        return None
    return (f"loop.replicas = {world} needs cuda:{index}..cuda:{index + world - 1}, one device "
            f"per rank; this machine has {available} CUDA device(s) (fewer ranks: --ranks "
            "resumes a run on another count; or place the run where it fits)")


def capability_problems(least: str, device: str) -> list[str]:
    """Why ``device`` is below the compute capability ``least`` a task declares."""
    import torch

    if not device.startswith("cuda"):
        return [f"the task needs a CUDA device of capability {least} or more; this is {device}"]
    if not torch.cuda.is_available():
        return [f"the task needs CUDA capability {least}; CUDA is not available here"]
    index = int(device.split(":")[1]) if ":" in device else 0
    major, minor = torch.cuda.get_device_capability(index)
    wanted = tuple(int(p) for p in least.split("."))
    if (major, minor) < wanted:
        return [f"{torch.cuda.get_device_name(index)} has capability {major}.{minor}; the task "
                f"needs {least}"]
    return []


def device_name_problem(device: str) -> str | None:
    """Why ``device`` is not a device name this tool runs on (bad input), or None."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as error:
        return f"device {device!r} is not a torch device ({error})"
    if parsed.type not in ("cpu", "cuda"):
        return f"device {device!r}: only cpu and cuda devices are supported"
    return None


def device_problems(device: str, *, allocate: bool = False) -> list[str]:
    """Why ``device`` cannot run here: not a device name, a CUDA index this machine does not
    have (a CPU-only torch), or, with ``allocate`` (the pilot, in a child of the task host),
    a device that refuses a small allocation (busy, broken, in an exclusive mode held by
    another process); nothing when it can. Without ``allocate`` no CUDA context is created:
    a worker that checks before it claims keeps the device free for its runs."""
    import torch

    named = device_name_problem(device)
    if named is not None:
        return [named]
    parsed = torch.device(device)
    if parsed.type == "cpu":
        return []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (parsed.index or 0) >= count:
        build = "; this torch is a CPU-only build" if torch.version.cuda is None else ""
        return [f"device {device} does not exist here ({count} CUDA device(s) visible{build})"]
    if not allocate:
        return []
    try:  # in a child of the task host: the host itself never initialises CUDA
        torch.empty(1024, device=parsed).sum().item()
    except RuntimeError as error:
        return [f"device {device} refuses a 4 KiB allocation ({str(error).splitlines()[0]})"]
    return []


def cuda_device_count() -> int:
    """How many CUDA devices this process sees (0 on a CPU-only torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def refuse_missing_device(device: str) -> None:
    """A device that does not exist here (or refuses 4 KiB) proves nothing: exit 1; a name that
    is no device: bad input, exit 2."""
    missing = device_problems(device, allocate=True)
    if missing:
        kind = LoopError if device_name_problem(device) else DeviceUnavailable
        raise kind(f"--device {device}: " + "; ".join(missing))
