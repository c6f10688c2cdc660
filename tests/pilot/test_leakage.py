"""The leakage and duplicate checks read every example's id and group (issue 42, item 4): a
split of 31,033 examples with one leak planted where a 20,000 sample does not look is caught;
a task that gives ``example_keys`` has them read instead of its examples; a task whose
examples are costly is sampled, and the line says the chance of missing a leak."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import campaign
from campaign.loop.data import GATE_SAMPLE, gate_view
from campaign.pilot.data_gate import check_data

SIZE = 31_033


class Counted:
    """A lazy split that counts its reads."""

    def __init__(self, size: int, prefix: str, leak: int | None = None) -> None:
        self.size, self.prefix, self.leak, self.reads = size, prefix, leak, 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        self.reads += 1
        group = "v0" if index == self.leak else f"{self.prefix}{index}"
        return {"id": f"{self.prefix}{index}", "group": group,
                "x": np.zeros(2, dtype=np.float32), "y": 0.0}


class Leaky(campaign.Task):
    kind, target = "regression", "y"

    def __init__(self, config: dict[str, Any], leak: int) -> None:
        super().__init__(config)
        self.data = {"train": Counted(SIZE, "t", leak), "val": Counted(100, "v")}

    def model(self) -> torch.nn.Module:
        return torch.nn.Linear(2, 1)

    def splits(self) -> dict[str, Any]:
        return self.data

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return self.outputs(model, batch).sum(), len(batch["ids"])


def _unsampled_index() -> int:
    """An index of the training split the gate's seeded sample does not read."""
    chosen = {example["id"] for example in gate_view(Counted(SIZE, "t"))[0]}
    return next(i for i in range(SIZE) if f"t{i}" not in chosen)


def _findings(task: campaign.Task) -> dict[str, Any]:
    return {f.check: f for f in check_data(task, {"loop": {}})}


def test_a_leak_outside_the_sample_is_caught() -> None:
    leak = _unsampled_index()
    findings = _findings(Leaky({}, leak))
    assert not findings["groups_disjoint"].ok
    detail = findings["groups_disjoint"].detail
    assert "1 groups are in more than one split: 'v0' (train+val)" in detail
    assert "ids and groups of every example read" in findings["sampled"].detail


class Keyed(Leaky):
    """Gives its keys without building examples: the gate reads those, not the examples."""

    def example_keys(self, split: str) -> list[dict[str, Any]]:
        data = self.data[split]
        return [{"id": f"{data.prefix}{i}",
                 "group": "v0" if i == data.leak else f"{data.prefix}{i}"}
                for i in range(len(data))]


def test_example_keys_are_read_instead_of_the_examples() -> None:
    task = Keyed({}, _unsampled_index())
    findings = _findings(task)
    assert not findings["groups_disjoint"].ok and "'v0'" in findings["groups_disjoint"].detail
    assert task.data["train"].reads <= GATE_SAMPLE + 64  # the sample (and a few collated)


class Short(Keyed):
    def example_keys(self, split: str) -> list[dict[str, Any]]:
        return super().example_keys(split)[:-1]


def test_example_keys_that_miss_an_example_fail_the_gate() -> None:
    finding = _findings(Short({}, None))["example_keys"]
    assert not finding.ok and f"train: {SIZE - 1:,} keys for {SIZE:,} examples" in finding.detail


class Costly(Leaky):
    costly_examples = True


def test_a_costly_task_is_sampled_and_the_line_says_the_chance_of_missing() -> None:
    task = Costly({}, _unsampled_index())
    finding = _findings(task)["groups_disjoint"]
    assert finding.ok  # the leak lies outside the sample: missed, and said how likely that was
    missed = 1 - GATE_SAMPLE / SIZE
    assert f"train {GATE_SAMPLE:,} of {SIZE:,}" in finding.detail
    assert f"missed with probability {missed:.1%}" in finding.detail
    assert task.data["train"].reads <= GATE_SAMPLE + 64
