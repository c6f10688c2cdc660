"""The gate's sample of each split, read once in the pilot's data phase.

The data gate, the search for the longest training examples and the choice of the overfit
check's examples all take the same seeded sample of the training split
(:func:`campaign.loop.data.gate_view`: every example up to 20,000, else a seeded sample of
that many). A lazy dataset generates or loads each example on access, so reading that sample
three times cost the pilot three times the read: on ten million generated examples, most of
its data phase. The pilot asks the task for its splits once (``SeededSplits``) and reads each
split's sample once; the views live for the data phase only, so the phases it measures after
hold one effective batch and the overfit examples, not the sample.
"""

from __future__ import annotations

from typing import Any

from campaign.loop.data import GATE_SAMPLE, gate_view


class GateViews:
    """``gate_view`` of each split, read on first use and kept while this object lives.

    Keyed by the split object itself (held here, so its id is never reused for another
    object) and the sample's size and seed: a split this cache has not seen is read, never
    answered with another split's examples. Callers get their own list of the examples.
    """

    def __init__(self) -> None:
        self._views: dict[tuple[int, int, int], tuple[Any, list[Any], str]] = {}

    def __call__(
        self, dataset: Any, limit: int = GATE_SAMPLE, seed: int = 0
    ) -> tuple[list[Any], str]:
        key = (id(dataset), limit, seed)
        held = self._views.get(key)
        if held is None or held[0] is not dataset:
            examples, note = gate_view(dataset, limit, seed)
            held = self._views[key] = (dataset, examples, note)
        return list(held[1]), held[2]
