"""The Markdown export: GitHub-flavoured, conclusion and flags first, figures left out.

User text is escaped with backslashes (``\\|``, ``\\<``), which CommonMark
renders as the characters themselves: no HTML entity reaches the page and no
user string becomes markup or breaks a table.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from campaign.report.humane import cell, label

# Underscores are left alone: inside a word they never emphasise (CommonMark), and stop
# causes such as non_finite_loss stay searchable.
ESCAPED = str.maketrans({"\\": "\\\\", "|": "\\|", "<": "\\<", ">": "\\>", "*": "\\*",
                         "&": "\\&",
                         "`": "\\`", "[": "\\[", "]": "\\]", "\n": " "})
# Every column of the run table but the control mark (the variants table has it).
RUN_COLUMNS = ("run_id", "variant", "seed", "original", "status", "stop_cause", "stop_step",
               "stop_phase", "stop_detail", "updates_planned", "updates_done", "examples_seen",
               "final_metric", "final_metric_step", "best_metric", "best_metric_step",
               "training_s", "overhead_s", "wall_time_s", "projected_s",
               "peak_allocated_bytes", "peak_rss_bytes", "relaunch_of", "relaunch_reason",
               "deviation", "flags")


# A scheme that runs code or reads files when a renderer links it (linkify, an editor's
# preview): its colon escaped, the text stays the same and nothing can make it a link.
DANGEROUS_SCHEME = re.compile(r"(?i)\b(javascript|vbscript|data|file)\s*:")


def text(value: Any) -> str:
    escaped = str(value).translate(ESCAPED)
    return DANGEROUS_SCHEME.sub(lambda m: m.group(0)[:-1] + "\\:", escaped)


def table(frame: pd.DataFrame, columns: tuple[str, ...] | None = None) -> str:
    if frame.empty:
        return "(none)"
    columns = columns or tuple(frame.columns)
    header = "| " + " | ".join(text(label(c)) for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = ["| " + " | ".join(text(cell(c, row[c])) for c in columns) + " |"
             for row in frame.to_dict("records")]
    return "\n".join([header, rule, *lines])


def markdown(sheet: Any) -> str:
    c = sheet.campaign
    direction = "higher" if sheet.mode == "max" else "lower"
    flags = sheet.flags
    summary = (", ".join(f"{k} {n}" for k, n in flags["kind"].value_counts().items())
               if len(flags) else "none")
    parts = [
        f"# {text(c['name'])}", "",
        f"task `{c['task']}` · spec sha256 `{c['spec_sha256']}` · metric "
        f"`{sheet.metric}` ({direction} is better)", "",
        "## Conclusion", "", text(sheet.conclusion), "",
        table(sheet.conclusions), "",
        "95% interval: paired Student t over seeds where both have a value; "
        "under 3 pairs not estimable.", "",
        *_search(sheet),
        f"## Integrity flags ({summary})", "",
        table(flags) if len(flags) else "None: every finished run replayed identically, started "
        "through a passing pilot on the same stack, and kept the plan.", "",
        f"## Variants ({variants_heading(sheet)})", "", table(sheet.variants), "",
        "## Deltas against the control, seed by seed", "", table(sheet.deltas), "",
        "## Relaunches (never pooled into a variant)", "", table(sheet.relaunches), "",
        "## Every run", "", table(sheet.runs, RUN_COLUMNS), "",
        "## Pilot: phases", "", table(sheet.phases), "",
        "## Notes", "", table(sheet.notes), "",
    ]
    return "\n".join(parts)


def variants_heading(sheet: Any) -> str:
    """What the variants table counts: the original runs, or a search's confirmation runs."""
    if sheet.search is None:
        return "original runs, one per seed"
    seeds = ", ".join(map(str, sheet.search["confirm_seeds"]))
    return f"the search's confirmation runs, seeds {seeds}: what the conclusion counts"


def _search(sheet: Any) -> list[str]:
    from campaign.report.search_section import search_frames, search_words

    if sheet.search is None:
        return []
    summary, audit = search_words(sheet.search)
    frames = search_frames(sheet.search)
    return ["## Search", "", text(summary), "",
            "### Confirmation on fresh seeds (selection = search estimate - confirmation's)", "",
            table(frames["confirmation"]), "", "### Audit of pruning", "", text(audit), "",
            "### Space explored", "", table(frames["variants"]), "",
            "### Rung decisions", "", table(frames["decisions"]), ""]
