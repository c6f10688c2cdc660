"""The dashboard against the HTML report on the report benchmark's ledger, and an empty poll.

    python benchmarks/serve.py [--runs 1000] [--points 1000] [--rounds 3]

The ledger of ``report.py`` (1,000 runs x 1,000 updates, 1.1 M metric rows,
4 variants), with its last 4 runs left running. A real ``campaign serve``
application on uvicorn in a thread of this process answers HTTP requests
from urllib. Compared, interleaved, medians:

- **report**: ``campaign report --format html``'s work (balance sheet, the
  figures, the self-contained HTML), in process;
- **campaign page**: what a browser asks for when it opens the campaign, over
  HTTP: the page, with the balance sheet's tables and, embedded, its first
  poll (every point of train/loss and the validation metric, run by run,
  from the same read of the points as the balance sheet);
- **page without the embedded first poll**, for comparison: the balance sheet
  tables, then ``/api/live`` reading every point again (what the first
  version did).

Then an **empty poll**: ``/api/live`` with the cursor of the poll before,
nothing written since; timed at the server (the application's ``Watcher.poll``
plus the JSON encoding, in process) and over HTTP.

Goals (issue 15): the campaign page within 1.5x of the report; an empty poll
at most 20 ms at the server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import interleaved
from report import build

from campaign.ledger import LedgerReader
from campaign.report.balance import balance_sheet
from campaign.report.render import html
from campaign.serve.app import create_app
from campaign.serve.dashboard_server import bind
from campaign.serve.guard import LOOPBACK_NAMES
from campaign.serve.watch import Cursor, Watcher

KEYS = "key=train/loss&key=val/accuracy"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as response:
        return response.read()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="campaign-serve-")) / "ledger.db"
    began = time.perf_counter()
    build(path, args.runs, args.points, running=4)
    print(f"built {args.runs} runs x {args.points} updates in {time.perf_counter() - began:.0f} s")
    reader = LedgerReader.open(f"sqlite:///{path}")
    sock = bind("127.0.0.1", 0)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    app = create_app(reader, hosts=LOOPBACK_NAMES)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    sizes: dict[str, int] = {}

    def page() -> None:
        sizes["page"] = len(_get(base + "c/big"))

    def separately() -> None:
        from campaign.report.render import sheet_context

        sheet_context(balance_sheet(reader, "big"))
        sizes["first poll"] = len(_get(base + f"api/live?campaign=big&{KEYS}"))

    medians = interleaved({
        "report --format html (in process)": lambda: html(balance_sheet(reader, "big")),
        "campaign page (HTTP)": page,
        "tables, then a first poll (HTTP)": separately,
    }, args.rounds)
    report_s = medians["report --format html (in process)"]
    for name, seconds in medians.items():
        print(f"  {name:<40} {seconds:7.2f} s   {seconds / report_s:5.2f}x of the report")
    print(f"  page {sizes['page'] / 1e6:.1f} MB (its first poll embedded); a first poll alone "
          f"{sizes['first poll'] / 1e6:.1f} MB")

    watcher = Watcher(reader)
    keys = ["train/loss", "val/accuracy"]
    cursor = watcher.poll("big", None, keys)["cursor"]
    assert len(Cursor.decode(cursor).open) == 4  # the runs left running
    at_server, over_http, sizes_empty = [], [], []
    for _ in range(50):
        start = time.perf_counter()
        reply = json.dumps(watcher.poll("big", Cursor.decode(cursor), keys))
        at_server.append(time.perf_counter() - start)
        start = time.perf_counter()
        body = _get(base + f"api/live?campaign=big&{KEYS}&cursor={cursor}")
        over_http.append(time.perf_counter() - start)
        sizes_empty.append(len(body))
        assert json.loads(reply)["runs"] is None
    print(f"  empty poll at the server: median {statistics.median(at_server) * 1e3:.1f} ms, "
          f"p90 {sorted(at_server)[44] * 1e3:.1f} ms; over HTTP: median "
          f"{statistics.median(over_http) * 1e3:.1f} ms; reply {max(sizes_empty)} bytes")
    server.should_exit = True
    thread.join(timeout=10)


if __name__ == "__main__":
    main()
