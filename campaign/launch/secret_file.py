"""Handing a ledger URL to an engine without its password.

What an engine is given (a Ray task's arguments, kept in its control store and
shown by its dashboard) carries the URL with the password taken out. The
password travels in a file only its owner can read: mode 0600 in a 0700
folder (``CAMPAIGN_SECRETS_DIR``, default ``~/.campaign/secrets``; on a
cluster, a home directory the nodes share), outside the artifacts folder,
and removed when the launch ends. The task reads it back and opens the
ledger with the whole URL.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

SECRETS_ENV = "CAMPAIGN_SECRETS_DIR"


def secrets_folder() -> Path:
    """A fresh 0700 folder of this launch's inside the secrets folder (whose own mode is left
    as it is: it may be a team's)."""
    base = Path(os.environ.get(SECRETS_ENV) or Path.home() / ".campaign" / "secrets")
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Path(tempfile.mkdtemp(prefix="launch-", dir=base))  # mode 0700


@contextmanager
def handed_over(url: str) -> Iterator[tuple[str, str | None]]:
    """``(the URL without its password, the file holding the password or None)`` for as long
    as the launch lasts; the file is removed afterwards."""
    parsed = make_url(url)
    if parsed.password is None:
        yield url, None
        return
    folder = secrets_folder()
    path = folder / "ledger.secret"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(str(parsed.password))
    try:
        yield parsed.set(password=None).render_as_string(hide_password=False), str(path)
    finally:
        path.unlink(missing_ok=True)
        folder.rmdir()


def taken_back(url: str, secret: str | None) -> str:
    """The whole URL again, in the engine's task."""
    if secret is None:
        return url
    password = Path(secret).read_text()
    return make_url(url).set(password=password).render_as_string(hide_password=False)
