"""The search's space, drawn: each searched key against the metric, one panel per key.

Variants that completed the search are filled dots at their mean final value; pruned ones
are grey crosses at their mean at the last rung they reached (an earlier, lower value:
drawn apart, never on the same scale of meaning); audited ones are triangles at their final
value; the control is a dashed line. Numeric keys of a log-uniform range on a log axis.
"""

from __future__ import annotations

from typing import Any

from campaign.report.plots import _png, plt

MARKERS = {"searched": ("o", "#1f77b4"), "confirmed": ("o", "#2ca02c"),
           "audit": ("^", "#ff7f0e"), "pruned": ("x", "#999999")}


def space_chart(search: dict[str, Any], metric: str) -> bytes | None:
    rows = [r for r in search["variants"] if r["role"] != "control"]
    keys = list(search["space"]) or sorted({k for r in rows for k in r["params"]})
    if not rows or not keys:
        return None
    control = next((r["final_mean"] for r in search["variants"] if r["role"] == "control"), None)
    figure, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
    for axis, key in zip(axes[0], keys, strict=True):
        for role, (marker, colour) in MARKERS.items():
            mine = [r for r in rows if r["role"] == role and key in r["params"]]
            value = "rung_mean" if role == "pruned" else "final_mean"
            points = [(r["params"][key], r[value]) for r in mine if r[value] is not None]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            label = {"pruned": "pruned (at its last rung)", "audit": "audited (to the end)",
                     "confirmed": "confirmed", "searched": "completed"}[role]
            positions = [x if isinstance(x, int | float) else str(x) for x in xs]
            axis.scatter(positions, ys, marker=marker, color=colour, label=label)
        if control is not None:
            axis.axhline(control, color="black", linestyle="--", linewidth=1, label="control")
        if "log_uniform" in search["space"].get(key, {}):
            axis.set_xscale("log")
        axis.set_xlabel(key)
        axis.set_ylabel(metric)
    axes[0][0].legend(fontsize=7)
    return _png(figure)
