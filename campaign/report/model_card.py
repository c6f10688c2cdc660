"""The model card an export carries (``README.md``): what the model is the answer to.

A colleague handed the folder sees the campaign's question and its conclusion, which run
this is (variant, seed, id, how it ended), the value it reached, its integrity flags, the
final artifact's SHA-256 and the frozen base an adapter was trained on, before any
weights. Composed from the ledger alone (no torch): the command does it while its task
host starts.
"""

from __future__ import annotations

import json
from typing import Any

from campaign.ledger.reads import LedgerReader
from campaign.report.balance import balance_sheet
from campaign.report.markdown import text


def model_card(ledger: LedgerReader, run_id: str) -> str:
    """The card of ``run_id`` (Markdown; user text escaped as the Markdown report escapes it)."""
    record = ledger.run(run_id)
    campaign = ledger.campaign(record.campaign)
    sheet = balance_sheet(ledger, record.campaign)
    row = sheet.runs.set_index("run_id").loc[run_id]
    value, step = row.get("final_metric"), row.get("final_metric_step")
    flags = sheet.flags[sheet.flags["run_id"] == run_id]
    finals = ledger.artifacts(record.campaign).query("kind == 'final' and run_id == @run_id")
    events = ledger.events(record.campaign, run_id=run_id)
    bases = events[events["kind"] == "base_model"]["detail"].tolist()
    lines = [
        f"# {text(record.campaign)} / {text(record.variant)} / seed {record.seed}",
        "",
        f"Exported by `campaign export` from run `{run_id}`.",
        "",
        "## The question and the campaign's answer",
        "",
        f"> {text(campaign.question)}",
        "",
        text(sheet.conclusion),
        "",
        "## This run",
        "",
        f"- campaign {text(record.campaign)}, variant {text(record.variant)}"
        f"{' (the control)' if record.variant == _control(sheet) else ''}, seed {record.seed}",
        f"- run id `{run_id}`: {record.status} ({record.stop_cause}) at update "
        f"{record.stop_step}",
        f"- {sheet.metric} ({sheet.mode}): "
        + ("no value" if value is None or value != value
           else f"{float(value):.6g} (final, at update {step})"),
        f"- integrity flags: {', '.join(flags['kind']) if len(flags) else 'none'}",
        f"- final artifact SHA-256: `{finals['sha256'].iloc[-1] if len(finals) else '?'}`",
    ]
    if bases:  # an adapter: the frozen base it was trained on
        base = json.loads(bases[0])
        lines.append(f"- frozen base: SHA-256 `{base.get('sha256', '?')}`, tokenizer "
                     f"{text(base.get('tokenizer', '?'))}")
    lines += ["", "The resolved config of the run is in the ledger (`campaign show RUN_ID`).", "",
              ""]
    return "\n".join(lines)


def _control(sheet: Any) -> str | None:
    controls = sheet.variants[sheet.variants["is_control"]]["variant"].tolist()
    return controls[0] if controls else None

