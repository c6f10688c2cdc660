"""Relaunches kept apart: each on its own line with its lineage and its full config change.

A relaunch is never pooled into its variant (docs/report.md). Its line says
where it comes from (original -> relaunch -> ...), why, how it ended, its
metric, and every config key it changes against the original planned run,
not only the held ones. A change of a key that defines the grid's variants
(the learning rate of an lr sweep) is called out: such a run answers another
question than its variant's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from campaign.plan.config_keys import config_changes, flatten

COLUMNS = ("run_id", "relaunch_of", "original", "lineage", "variant", "seed", "reason", "status",
           "stop_cause", "metric", "changes", "changes_variant_key")


def lineage(runs: pd.DataFrame) -> dict[str, list[str]]:
    """run id -> the chain of ids from its original planned run to itself."""
    parent = dict(zip(runs["run_id"].tolist(), runs["relaunch_of"].tolist(), strict=True))
    chains: dict[str, list[str]] = {}
    for run_id in parent:
        chain, current = [run_id], parent.get(run_id)
        while isinstance(current, str) and current not in chain:
            chain.append(current)
            current = parent.get(current)
        chains[run_id] = chain[::-1]
    return chains


def defining_keys(runs: pd.DataFrame) -> set[str]:
    """The config keys that tell the variants apart: those in which an original run of some
    variant differs from the control's original run of the same seed."""
    originals = runs[runs["relaunch_of"].isna()]
    controls = {
        int(r.seed): flatten(r.config) for r in originals[originals["is_control"]].itertuples()
    }
    keys: set[str] = set()
    for row in originals[~originals["is_control"]].itertuples():
        base = controls.get(int(row.seed)) or next(iter(controls.values()), None)
        if base is None:
            continue
        mine = flatten(row.config)
        keys |= {k for k in base.keys() | mine.keys() if base.get(k) != mine.get(k)}
    return keys - {"seed"}


def relaunch_table(
    runs: pd.DataFrame, metrics: Mapping[str, Any], variant_keys: set[str]
) -> pd.DataFrame:
    """One line per relaunch (``runs`` needs run_id, relaunch_of, relaunch_reason, variant,
    seed, status, stop_cause, config; ``metrics``: run id -> final metric)."""
    chains = lineage(runs)
    configs = dict(zip(runs["run_id"], runs["config"], strict=True))
    rows = []
    for row in runs[runs["relaunch_of"].notna()].itertuples():
        chain = chains[row.run_id]
        changes = config_changes(configs[chain[0]], row.config)
        metric = metrics.get(row.run_id)
        rows.append({
            "run_id": row.run_id, "relaunch_of": row.relaunch_of, "original": chain[0],
            "lineage": " -> ".join(chain), "variant": row.variant, "seed": int(row.seed),
            "reason": row.relaunch_reason, "status": row.status, "stop_cause": row.stop_cause,
            "metric": None if metric is None or pd.isna(metric) else float(metric),
            "changes": changes,
            "changes_variant_key": sorted(k for k in changes if k in variant_keys),
        })
    return pd.DataFrame(rows, columns=list(COLUMNS))
