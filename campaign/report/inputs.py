"""What a command's output must never replace: the campaign's own inputs.

``campaign report C --output campaign.db`` once replaced the ledger itself (exit 0), and an
``--output`` onto a run's ``final.safetensors`` or onto the spec replaced them. A report,
an archive or a TensorBoard state file is refused when its path is the ledger file (or
its WAL, shared-memory or journal file), an artifact the ledger names for the campaign,
or a spec file of the campaign (TOML whose ``[campaign] name`` is the campaign's); the
path is compared after resolving links, so ``./x/../campaign.db`` is the ledger too.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


@dataclass(frozen=True)
class CampaignInputs:
    """The files of one campaign that outputs must leave alone."""

    campaign: str
    files: dict[Path, str] = field(default_factory=dict)  # resolved path -> what it is

    def refusal(self, path: Path) -> str | None:
        """Why ``path`` may not be written, in words; None when it may."""
        resolved = path.resolve()
        what = self.files.get(resolved)
        if what is not None:
            return f"{path} is {what}: an output never replaces an input (choose another path)"
        if path.suffix == ".toml" and path.is_file() and _names_campaign(path, self.campaign):
            return (f"{path} is a spec of campaign {self.campaign!r}: an output never replaces "
                    "an input (choose another path)")
        return None


def campaign_inputs(ledger: object, campaign: str) -> CampaignInputs:
    """The ledger's files (SQLite) and every artifact the ledger names for ``campaign``."""
    files: dict[Path, str] = {}
    engine_url = ledger.engine.url  # type: ignore[attr-defined]
    if engine_url.get_backend_name() == "sqlite" and engine_url.database not in (None, "",
                                                                                  ":memory:"):
        database = Path(engine_url.database)
        for suffix in SQLITE_COMPANIONS:
            files[Path(f"{database}{suffix}").resolve()] = "the campaign's ledger"
    for row in ledger.artifacts(campaign).itertuples():  # type: ignore[attr-defined]
        files.setdefault(Path(row.path).resolve(), f"artifact {row.id} ({row.kind}) of run "
                                                   f"{row.run_id}")
    return CampaignInputs(campaign, files)


def _names_campaign(path: Path, campaign: str) -> bool:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    section = document.get("campaign")
    return isinstance(section, dict) and section.get("name") == campaign
