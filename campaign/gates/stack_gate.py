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
starts (both in :mod:`campaign.stack.devices`, below the loop, which refuses the same).
Declared needs are read from the factory's module without building
the task (no data is loaded for a check).
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import re
from collections.abc import Mapping
from typing import Any

from campaign.errors import TaskReferenceError
from campaign.loop.taskref import load_factory
from campaign.stack.devices import (
    capability_problems,
    device_problems,
    precision_problem,
    ranks_problem,
)


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
        problems += capability_problems(str(least), device)
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


def unfit_problems(task_reference: str, device: str, precisions: list[str],
                   worlds: list[int] | None = None) -> list[str]:
    """Everything this stack misses to run the task's runs on ``device`` at ``precisions``
    with ``worlds`` ranks each: the device itself, the declared requirements, each precision,
    each rank count (one line each)."""
    problems = device_problems(device)
    if problems:
        return problems
    problems = stack_problems(task_reference, device)
    problems += [p for p in (precision_problem(x, device) for x in precisions) if p]
    return problems + [p for p in (ranks_problem(w, device) for w in worlds or []) if p]
