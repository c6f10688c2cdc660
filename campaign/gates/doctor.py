"""``campaign doctor``: the software stack, the ledger's revision, and runs whose heartbeat
stopped, declared lost (or, in a dry run, listed by the same rule the sweep applies)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError

from campaign.host.calls import with_torch
from campaign.ledger import migrate
from campaign.ledger.store import Ledger
from campaign.stack.software import environment


def examine(url: str, *, stale_after_s: float, dry_run: bool) -> dict[str, Any]:
    """The doctor's document: ``stack``, ``ledger`` (revision state) and ``stale_runs``."""
    Ledger.open(url, check=False).close()  # a missing SQLite file: NoLedger, nothing created
    state = migrate.describe_url(url)
    stale: list[dict[str, Any]] = []
    if state["revision"] == state["head"]:
        with Ledger.open(url) as ledger:
            names = dict(ledger.campaigns()[["id", "name"]].itertuples(index=False))
            action = "would be declared lost" if dry_run else "declared lost"
            stale = [
                {"campaign": names.get(lost.campaign_id), "run_id": lost.run_id,
                 "worker": lost.worker, "silent_s": round(lost.silent_s, 1), "action": action}
                for lost in ledger.mark_lost(stale_after_s, dry_run=dry_run)
            ]
    state["integrity"] = "; ".join(integrity_problems(url)) or "ok"
    stack = with_torch(environment, None, what="describing the software stack")
    return {"stack": stack, "ledger": state, "stale_runs": stale}


def integrity_problems(url: str) -> list[str]:
    """SQLite's ``quick_check`` of every page (a corrupted metrics page once went unnoticed,
    reported as ``updates_done 0``); PostgreSQL checks its own pages."""
    with Ledger.open(url, check=False) as ledger:
        if ledger.engine.dialect.name != "sqlite":
            return []
        try:
            with ledger.engine.connect() as conn:
                found = [str(r) for r in conn.exec_driver_sql("PRAGMA quick_check").scalars()]
        except DBAPIError as error:
            return [str(error.orig).splitlines()[0] if error.orig else str(error)]
    if found == ["ok"]:
        return []
    lines = [line for text in found for line in text.splitlines() if not line.startswith("***")]
    return [*lines[:3], f"{len(lines)} problems in all"] if len(lines) > 3 else lines
