"""`campaign serve` on SQLite and PostgreSQL: only what is new per poll, read-only by
construction, the token off loopback, the Host check, one-line errors, a clean Ctrl-C.

The server runs as a real `campaign serve` process; requests go over HTTP with urllib.
"""

from __future__ import annotations

import base64
import hashlib
import json
import signal
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from campaign.ledger import Ledger, LedgerReader, StopRecord
from campaign.ledger.connections import sqlite_path
from campaign.serve.watch import Cursor, Watcher, decoded
from tests.support.helpers import plan_campaign
from tests.support.launch_helpers import run, start

HOSTILE = "<script>alert(1)</script>"
TABLES = ("campaigns", "variants", "runs", "segments", "metrics", "events", "artifacts",
          "notes", "pilots", "phase_measurements")


def _fill(ledger: Ledger, name: str = "watched") -> list[str]:
    """A campaign with a hostile variant name and note: two runs ended, two still running."""
    record = plan_campaign(ledger, name, seeds=2, variants={HOSTILE: 1e-4, "other": 2e-4})
    for index, _ in enumerate(record.run_ids):
        claim = ledger.claim_next(name, "test")
        assert claim is not None
        with ledger.metric_writer(claim.run_id, claim.segment_id) as metrics:
            for step in range(1, 11):
                metrics.log("train/loss", step, 2.0 / step + index, 16 * step)
                if step % 5 == 0:
                    metrics.log("val/loss", step, 3.0 / step, 16 * step)
        if index < 2:
            ledger.finish(claim.run_id, "completed", StopRecord("budget_reached", 10, "update"))
    ledger.add_note(name, f"a note with {HOSTILE} in it")
    return list(record.run_ids)


@pytest.fixture
def server(ledger_url: str) -> Iterator[dict[str, Any]]:
    """A filled ledger and a `campaign serve --port 0` over it; stopped with Ctrl-C."""
    with Ledger.open(ledger_url, create=True) as ledger:
        ids = _fill(ledger)
    process = start(ledger_url, "serve", "--port", "0")
    url = process.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), process.stderr.read()
    yield {"url": url, "ids": ids, "ledger": ledger_url, "process": process}
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _state(url: str) -> tuple[str, dict[str, int]]:
    """The ledger's bytes (SQLite) and every table's row count: what a reader must not change."""
    with Ledger.open(url) as ledger:
        with ledger.engine.connect() as conn:
            counts = {t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one()
                      for t in TABLES}
        path = sqlite_path(ledger.engine.url)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path else ""
    return digest, counts


def test_pages_and_the_api_answer_with_the_security_headers(server: dict[str, Any]) -> None:
    base = server["url"]
    status, body, headers = _get(base)
    assert status == 200 and b"watched" in body
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer"
    status, body, _ = _get(base + "c/watched")
    page = body.decode()
    assert status == 200 and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert HOSTILE not in page.replace('<script type="application/json" id="page-data">', "")
    assert "<script>alert" not in page  # the JSON block escapes "<" as \u003c
    for run_id in server["ids"]:
        status, body, _ = _get(base + f"r/{run_id}")
        assert status == 200 and run_id.encode() in body
    status, body, _ = _get(base + "c/no-such-campaign")
    assert status == 404 and b"no campaign named" in body
    status, body, _ = _get(base + "api/live?campaign=watched&cursor=not-a-cursor")
    assert status == 400 and b"unreadable cursor" in body
    status, _, _ = _get(base + "static/vendor/uPlot.iife.min.js")
    assert status == 200
    status, _, headers = _get(base, {"Host": "evil.example:8321"})  # DNS rebinding
    assert status == 400


def test_crawling_every_page_leaves_the_ledger_unchanged_and_writes_are_refused(
    server: dict[str, Any],
) -> None:
    before = _state(server["ledger"])
    base = server["url"]
    paths = ["", "api/campaigns", "c/watched", "api/live?campaign=watched",
             *[f"r/{i}" for i in server["ids"]],
             *[f"api/live?campaign=watched&run={i}" for i in server["ids"]]]
    for path in paths:
        status, body, _ = _get(base + path)
        assert status == 200, (path, body[:300])
    cursor = json.loads(_get(base + "api/live?campaign=watched")[1])["cursor"]
    assert _get(base + f"api/live?campaign=watched&cursor={cursor}")[0] == 200
    for method in ("POST", "PUT", "DELETE"):
        request = urllib.request.Request(base + "c/watched", method=method, data=b"")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405
    assert _state(server["ledger"]) == before  # bytes and rows
    # By construction: the connections the server reads through refuse writes themselves.
    with (
        LedgerReader.open(server["ledger"]) as reader,
        reader.engine.connect() as conn,
        pytest.raises(Exception, match=r"(?i)read-?only"),
    ):
        conn.execute(text("UPDATE campaigns SET question = 'changed'"))


def test_a_poll_returns_only_what_is_new(ledger: Ledger) -> None:
    """The cursor protocol on a real ledger: first load, nothing new, new points, an end,
    a resume that re-runs steps (the page is told where to cut), a run that starts."""
    ids = _fill(ledger)
    time.sleep(1.1)  # the two ended runs started more than START_SLACK before the first poll
    reader = LedgerReader.open(str(ledger.engine.url.render_as_string(hide_password=False)))
    watcher = Watcher(reader)
    first = watcher.poll("watched", None, ["train/loss", "val/loss"])
    assert len(first["runs"]) == 4 and first["status"]["done"] == 2
    assert {run: len(pair[0]) for run, pair in decoded(first["points"])["train/loss"].items()
            } == {run: 10 for run in ids}
    cursor = Cursor.decode(first["cursor"])
    assert set(cursor.open) == set(ids[2:])  # the running ones
    empty = watcher.poll("watched", cursor, ["train/loss", "val/loss"])
    assert empty["runs"] is None and empty["reset"] == {}
    # nothing new: at most the shown step of each open run comes again (read with >=)
    again = [s for pair in decoded(empty["points"]).get("train/loss", {}).values()
             for s in pair[0]]
    assert again == [10, 10]
    running = ids[2]
    claim_segment = int(ledger.segments("watched").query("run_id == @running")["segment_id"].max())
    with ledger.metric_writer(running, claim_segment) as metrics:
        metrics.log("train/loss", 11, 0.25, 176)
        metrics.log("extra/key", 11, 1.5, 176)
    new = watcher.poll("watched", Cursor.decode(empty["cursor"]), None)
    assert decoded(new["points"])["train/loss"][running] == ([10, 11], [2.0 / 10 + 2, 0.25])
    assert decoded(new["points"])["extra/key"][running] == ([11], [1.5])
    ledger.finish(running, "interrupted", StopRecord("interrupted", 11, "update"))
    ended = watcher.poll("watched", Cursor.decode(new["cursor"]), ["train/loss"])
    assert ended["runs"] is not None  # a status changed: the run list comes again
    resumed = ledger.start(running, "test-2", start_step=5)
    with ledger.metric_writer(running, resumed.segment_id) as metrics:
        metrics.log("train/loss", 6, 9.0, 96)
    after = watcher.poll("watched", Cursor.decode(ended["cursor"]), ["train/loss"])
    assert after["reset"] == {running: 5}
    assert decoded(after["points"])["train/loss"][running] == ([6], [9.0])
    reader.close()


def test_a_page_that_fell_behind_a_resume_gets_the_older_segment_steps(ledger: Ledger) -> None:
    """The page shows 1-8; the run logs to 20, is resumed from 15 and logs 16-18 before the
    next poll: the page gets 9-15 of the old segment and 16-18 of the new one, cut at 15."""
    plan_campaign(ledger, "behind", seeds=1, variants={"only": 1e-4})
    claim = ledger.claim_next("behind", "test")
    assert claim is not None
    with ledger.metric_writer(claim.run_id, claim.segment_id) as metrics:
        for step in range(1, 9):
            metrics.log("train/loss", step, float(step), 16 * step)
    time.sleep(1.1)
    url = ledger.engine.url.render_as_string(hide_password=False)
    with LedgerReader.open(url) as reader:
        watcher = Watcher(reader)
        first = watcher.poll("behind", None, ["train/loss"])
        with ledger.metric_writer(claim.run_id, claim.segment_id) as metrics:
            for step in range(9, 21):
                metrics.log("train/loss", step, float(step), 16 * step)
        ledger.finish(claim.run_id, "interrupted", StopRecord("interrupted", 20, "update"))
        again = ledger.start(claim.run_id, "test-2", start_step=15)
        with ledger.metric_writer(claim.run_id, again.segment_id) as metrics:
            for step in range(16, 19):
                metrics.log("train/loss", step, 100.0 + step, 16 * step)
        late = watcher.poll("behind", Cursor.decode(first["cursor"]), ["train/loss"])
    assert late["reset"] == {claim.run_id: 15}
    steps, values = decoded(late["points"])["train/loss"][claim.run_id]
    assert steps == list(range(8, 19))
    assert values == [float(s) for s in range(8, 16)] + [116.0, 117.0, 118.0]


def test_hostile_requests_are_refused_without_a_server_error(server: dict[str, Any]) -> None:
    base = server["url"]
    forged = base64.urlsafe_b64encode(json.dumps(
        {"at": 1e300, "digest": "x", "open": {}}).encode()).decode()
    nested = base64.urlsafe_b64encode(b"[" * 5000).decode()  # past the JSON parser's depth
    for cursor in (forged, "e30", "!!!", nested):
        status, body, _ = _get(base + f"api/live?campaign=watched&cursor={cursor}")
        assert status == 400 and b"unreadable cursor" in body, (cursor, body)
    status, body, _ = _get(base + "api/live?campaign=watched&run=no-such-run")
    assert status == 404 and b"no run" in body
    status, _, _ = _get(base + "api/live")
    assert status == 400
    status, _, _ = _get(base + "static/../../etc/passwd")
    assert status == 404


def test_a_non_loopback_address_needs_a_token_and_without_it_answers_401(
    sqlite_url: str,
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        _fill(ledger)
    refused = run(sqlite_url, "serve", "--host", "0.0.0.0", "--token", "", timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "campaign: --host 0.0.0.0 is not a loopback address: the dashboard "
        "needs a token there (leave --token out to have one generated)"]
    process = start(sqlite_url, "serve", "--host", "0.0.0.0", "--port", "0", "--access-log")
    try:
        printed = process.stdout.readline().strip()
        token = urllib.parse.parse_qs(urllib.parse.urlsplit(printed).query)["token"][0]
        assert len(token) >= 24
        port = urllib.parse.urlsplit(printed).port
        base = f"http://127.0.0.1:{port}/"
        for path in ("", "c/watched", "api/live?campaign=watched", "static/dashboard.js"):
            status, body, _ = _get(base + path)
            assert status == 401 and b"token" in body, path
        assert _get(base + "?token=wrong")[0] == 401
        assert _get(base + "?token=%E2%9C%93")[0] == 401  # non-ASCII: still a 401
        assert _get(base, {"Authorization": "Bearer wrong"})[0] == 401
        status, _, headers = _get(base + "c/watched?token=" + token)
        assert status == 303 and headers["location"] == "/c/watched"
        cookie = headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert _get(base + "c/watched", {"Cookie": cookie.split(";")[0]})[0] == 200
        assert _get(base + "api/campaigns", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        process.send_signal(signal.SIGINT)
        _, log = process.communicate(timeout=30)
    assert process.returncode == 0
    assert '"GET /c/watched?token=*** HTTP/1.1" 303' in log  # the access log hides the token
    requests = [line for line in log.splitlines() if '"GET ' in line]
    assert requests and not any(token in line for line in requests)
    assert "Traceback" not in log


def test_another_loopback_address_is_served(sqlite_url: str) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        _fill(ledger)
    process = start(sqlite_url, "serve", "--host", "127.0.0.2", "--port", "0")
    try:
        printed = process.stdout.readline().strip()
        assert printed.startswith("http://127.0.0.2:")
        assert _get(printed + "c/watched")[0] == 200
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)



def test_ctrl_c_stops_it_from_the_moment_the_url_is_out_even_where_sigint_was_ignored(
    sqlite_url: str,
) -> None:
    """A script that reads the URL and signals at once, from a shell that started the server
    with SIGINT ignored (a background job, nohup): the signal stops it (before, 14 of 15 such
    servers ran on, the signal lost before uvicorn took SIGINT over)."""
    with Ledger.open(sqlite_url, create=True) as ledger:
        _fill(ledger)
    for _ in range(3):
        process = start(sqlite_url, "serve", "--port", "0",
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            assert process.stdout.readline().startswith("http://127.0.0.1:")
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=20)
        finally:
            process.kill()
        assert process.returncode == 0 and "campaign serve: stopped" in err, err

def test_a_busy_port_and_a_missing_ledger_are_one_line_each(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Ledger.open(sqlite_url, create=True) as ledger:
        _fill(ledger)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = run(sqlite_url, "serve", "--port", str(port), timeout=60)
    assert busy.returncode == 2
    assert busy.stderr.strip().splitlines() == [
        f"campaign: port {port} on 127.0.0.1 is already in use: pass --port N "
        "(--port 0 takes any free port)"]
    missing = run(f"sqlite:///{tmp_path / 'nothing.db'}", "serve", "--port", "0", timeout=60)
    assert missing.returncode == 3 and len(missing.stderr.strip().splitlines()) == 1
    assert "no ledger at" in missing.stderr and not (tmp_path / "nothing.db").exists()
    bad_host = run(sqlite_url, "serve", "--host", "no-such-host.invalid", "--token", "t",
                   "--port", "0", timeout=60)
    assert bad_host.returncode == 2 and "not an address of this machine" in bad_host.stderr
    assert len(bad_host.stderr.strip().splitlines()) == 1
