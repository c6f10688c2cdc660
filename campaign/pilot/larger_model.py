"""``campaign size --model-config``: a larger model of the same family, projected per gate class
from the pilot that passed for it (its forward pass's measured activations).

The arithmetic of one configuration is the causal-LM task's
(:mod:`campaign.tasks.causal_lm.memory_projection`); here each gate class with a passing pilot
gets its rows, and one without says which command measures it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from campaign.gates.classes import gate_class
from campaign.pilot.strategies import smallest_rentals, strategy_rows
from campaign.plan.time_projection import latest_passing_pilot
from campaign.tasks.causal_lm.memory_projection import ASSUMPTIONS, project


def project_campaign(ledger: Any, campaign: str, overrides: Mapping[str, Any],
                     headroom: float = 0.1, card: int | None = None) -> dict[str, Any]:
    """The projection for each gate class with a passing pilot (its run config, its pilot's
    forward measurement), with the assumptions in words; and the target's memory per device
    under each strategy and W, with the rental that fits (``strategies``)."""
    record = ledger.campaign(campaign)
    runs, pilots, phases = ledger.runs(campaign), ledger.pilots(campaign), ledger.phases(campaign)
    classes = []
    for config in runs.drop_duplicates("variant")["config"]:
        task = config.get("task") or {}
        if not (task.get("model_config") or task.get("model_path")):
            raise ValueError(f"--model-config: campaign {campaign!r} does not train a causal "
                             "LM (task.model_config or task.model_path)")
        class_id = gate_class(config).id
        if any(c["gate_class"] == class_id for c in classes):
            continue
        pilot_id = latest_passing_pilot(pilots, record.spec_sha256, class_id)
        rows = phases[(phases["pilot_id"] == pilot_id) & (phases["phase"] == "forward")]
        measured = (rows["inputs"].iloc[0] or {}).get("activations") if len(rows) else None
        if not measured:
            classes.append({"gate_class": class_id, "rows": [],
                            "note": "no passing pilot with an activation measurement: "
                                    f"`campaign pilot {campaign}`"})
            continue
        rows = project(config, measured, overrides)
        facts = next(r["target_estimate"] for r in rows if r["item"] == "strategy_facts")
        activations = next(r["target_estimate"] for r in rows if r["item"] == "activation_bytes")
        strategies = strategy_rows(facts, activations, config["loop"], None, headroom, card)
        classes.append({"gate_class": class_id, "pilot_id": pilot_id,
                        "adapter": task.get("adapter", "none"),
                        "rows": [r for r in rows if r["item"] != "strategy_facts"],
                        "strategies": [{"gate_class": class_id, **s} for s in strategies],
                        "rentals": smallest_rentals(strategies)})
    return {"target": dict(overrides), "assumptions": ASSUMPTIONS, "classes": classes}
