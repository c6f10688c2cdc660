"""The software stack as a gate: what a task declares it needs, and precision against the device.

Enough memory is not enough: a configuration is accepted only on a stack that
can run it. A task declares its needs next to its factory, as the factory's
(or its module's) ``REQUIREMENTS``::

    REQUIREMENTS = {
        "packages": {"torch": ">=2.6", "transformers": ">=4.40,<5"},
        "modules": ["flash_attn"],          # extensions that must import
        "cuda_capability": "8.0",           # the least compute capability
    }

:func:`stack_problems` lists what this process's stack misses (one line
each); the pilot refuses to pass, ``doctor CAMPAIGN`` reports it, and a worker
refuses to claim rather than only warning. :func:`precision_problem` refuses
bf16 on a CUDA device without bf16 support (and fp16 off CUDA) before any run
starts. Declared needs are read from the factory's module without building
the task (no data is loaded for a check).
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import re
from collections.abc import Mapping
from typing import Any

from campaign.plan.taskref import TaskReferenceError, load_factory


def declared(task_reference: str) -> Mapping[str, Any]:
    """The task's declared requirements (empty when it declares none)."""
    try:
        factory = load_factory(task_reference)
    except TaskReferenceError:
        return {}
    found = getattr(factory, "REQUIREMENTS", None)
    if found is None:
        module = importlib.import_module(factory.__module__)
        found = getattr(module, "REQUIREMENTS", None)
    return found if isinstance(found, Mapping) else {}


def stack_problems(task_reference: str, device: str = "cpu") -> list[str]:
    """What this process's stack misses of the task's declared requirements."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    needs = declared(task_reference)
    shape = _malformed(needs)
    if shape:
        return [f"the task's REQUIREMENTS: {shape}"]
    problems = []
    for package, wanted in (needs.get("packages") or {}).items():
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            problems.append(f"package {package} ({wanted}) is not installed")
            continue
        try:
            allowed = SpecifierSet(str(wanted))
        except InvalidSpecifier:
            problems.append(f"package {package}: {wanted!r} is not a version range")
            continue
        if not allowed.contains(version, prereleases=True):
            problems.append(f"package {package} {version} is installed, the task needs {wanted}")
    for module in needs.get("modules") or []:
        try:
            importlib.import_module(module)
        except Exception as error:  # an extension that fails to import, for whatever reason
            problems.append(f"module {module} does not import ({type(error).__name__}: {error})")
    least = needs.get("cuda_capability")
    if least is not None:
        problems += _capability(str(least), device)
    return problems


def _malformed(needs: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of REQUIREMENTS (None when it is well formed)."""
    if not isinstance(needs.get("packages") or {}, Mapping):
        return "'packages' must be a table of package -> version range"
    if not isinstance(needs.get("modules") or [], list | tuple):
        return "'modules' must be a list of module names"
    least = needs.get("cuda_capability")
    if least is not None and not re.fullmatch(r"\d+(\.\d+)?", str(least)):
        return f"'cuda_capability' must be like 8.0, got {least!r}"
    return None


def _capability(least: str, device: str) -> list[str]:
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
                f"needs {least}"]  # fmt: skip
    return []


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


def unfit_problems(task_reference: str, device: str, precisions: list[str]) -> list[str]:
    """Everything this stack misses to run the task's runs on ``device`` at ``precisions``:
    the device itself, the declared requirements, each precision (one line each)."""
    problems = device_problems(device)
    if problems:
        return problems
    problems = stack_problems(task_reference, device)
    return problems + [p for p in (precision_problem(x, device) for x in precisions) if p]


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
    from campaign.loop.errors import DeviceUnavailable, LoopError

    missing = device_problems(device, allocate=True)
    if missing:
        kind = LoopError if device_name_problem(device) else DeviceUnavailable
        raise kind(f"--device {device}: " + "; ".join(missing))
