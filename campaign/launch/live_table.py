"""The launcher's live progress: a table on a terminal (rich), plain lines in pipes and CI.

What it shows is a :class:`campaign.ledger.progress.Snapshot`, read from the ledger alone.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from campaign.ledger.progress import Snapshot


class ProgressDisplay:
    """A live table on a terminal (rich); on a pipe, a plain line whenever the counts change.

    Quiet on pipes and in CI except for those lines, as docs/cli.md asks.
    """

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._last_key: Any = None
        self._live: Any = None

    def show(self, snapshot: Snapshot) -> None:
        if self.live:
            self._show_live(snapshot)
            return
        key = (tuple(sorted(snapshot.counts.items())), len(snapshot.running))
        if key != self._last_key:
            self._last_key = key
            print(snapshot.line(), file=self.stream, flush=True)

    def _show_live(self, snapshot: Snapshot) -> None:
        from rich.console import Console
        from rich.live import Live

        if self._live is None:
            self._live = Live(console=Console(file=self.stream), refresh_per_second=4)
            self._live.start()
        self._live.update(render_table(snapshot))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def render_table(snapshot: Snapshot) -> Any:
    """The rich renderable of a snapshot: a summary caption over the running runs."""
    from rich.table import Table

    table = Table(title=snapshot.summary(), title_justify="left")
    table.add_column("run", no_wrap=True, min_width=26)  # ids are never cut
    for column in ("variant", "seed", "worker", "update", "heartbeat"):
        table.add_column(column, overflow="fold")
    for run in snapshot.running:
        share = f"{run.step}/{run.updates}"
        age = "" if run.heartbeat_age_s is None else f"{run.heartbeat_age_s:.0f}s ago"
        table.add_row(run.run_id, run.variant, str(run.seed), run.worker or "", share, age)
    return table
