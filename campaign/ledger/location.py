"""Where the ledger is when nobody says (docs/cli.md); no database driver imported here, so
the command line can name the default without loading SQLAlchemy."""

from __future__ import annotations

import os

DEFAULT_URL = "sqlite:///campaign.db"
ENV_VAR = "CAMPAIGN_LEDGER"


def resolve_url(explicit: str | None = None) -> str:
    """``--ledger URL``, else ``CAMPAIGN_LEDGER``, else the SQLite default."""
    return explicit or os.environ.get(ENV_VAR) or DEFAULT_URL
