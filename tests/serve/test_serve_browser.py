"""The dashboard in a real headless Chromium while a real campaign trains, SQLite and PostgreSQL.

A campaign on the digits task (one variant that diverges) is launched in the
background; the page, loaded once and never reloaded, must draw more points
between two reads seconds apart, mark the diverged runs once they end, show
the hostile question and note as text, and log no console error (no script
error, no blocked request, no CSP violation). Playwright drives Debian's
Chromium (no browser download); Chromium itself is what the report tests use.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from campaign.gates.launch_gate import open_gate
from campaign.ledger import Ledger
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec
from tests.conftest import REQUIRE_ALL
from tests.support.launch_helpers import start

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None


@pytest.fixture(autouse=True)
def _chromium_here() -> None:
    """Checked when a test runs, not at import (`make test-fast` deselects these tests)."""
    if CHROMIUM is None or sync_playwright is None:
        if REQUIRE_ALL:  # set by `make test`, which installs both
            raise RuntimeError("CAMPAIGN_REQUIRE_ALL is set but chromium or playwright is missing")
        pytest.skip("capability: no chromium or playwright on this machine")

HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"
NAME = "live"
SPEC: dict[str, Any] = {
    "campaign": {"name": NAME, "task": "tests.support.tasks.faulty:build",
                 "question": f"Does a sane learning rate beat {HOSTILE}?"},
    "hold": {"loop.microbatch": 4, "loop.accumulation": 2, "budget.updates": 150},
    "config": {"optimizer.name": "adamw", "task.limit": 300, "task.sleep": 0.02},
    "validation": {"every": 10, "metric": "val/accuracy", "mode": "max"},
    "stop": {"loss_explosion": 4.0},
    "grid": {"seeds": [0, 1], "control": "lr-1e-2", "axes": {"optimizer.lr": [1e-2, 3.0]}},
}


def _points(page: Any) -> int:
    return int(page.eval_on_selector("#curves", "node => node.dataset.points"))


def _wait(page: Any, condition: str, timeout: float) -> None:
    """Until ``condition`` (a function body's expression) holds in the page. Evaluated through
    the DevTools protocol: Playwright's own wait_for_function evaluates a string, which the
    dashboard's Content-Security-Policy refuses (no eval), as it should."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(f"() => Boolean({condition})"):
        assert time.monotonic() < deadline, f"not within {timeout} s: {condition}"
        time.sleep(0.2)


def test_the_dashboard_follows_a_training_campaign_in_chromium(
    ledger_url: str, tmp_path: Path
) -> None:
    with Ledger.open(ledger_url, create=True) as ledger:
        record_plan(ledger, make_plan(resolve_spec(SPEC, "<live>")))
        open_gate(ledger, NAME, skip_reason="a dashboard test, not a pilot test")
        ledger.add_note(NAME, f"watch out for {HOSTILE}")
        diverging = set(ledger.runs(NAME).query("variant == 'lr-3e0'")["run_id"])
    server = start(ledger_url, "serve", "--port", "0")
    launcher = None
    try:
        base = server.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:"), server.stderr.read()
        launcher = start(ledger_url, "launch", NAME, "--workers", "2", "--skip-pilot",
                         "--reason", "dashboard test", "--artifacts", str(tmp_path / "a"))
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                                 args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.on("dialog", lambda dialog: problems.append(f"dialog: {dialog.message}"))
            page.goto(base + f"c/{NAME}")
            _wait(page, "Number(document.querySelector('#curves').dataset.points) > 0", 120)
            first = _points(page)
            time.sleep(4)
            second = _points(page)
            assert second > first, (first, second)  # drawn live, without a reload
            assert launcher.wait(timeout=300) == 0, launcher.stderr.read()
            # the diverged runs end: marked, still without a reload
            _wait(page, "document.querySelectorAll('li.marker.diverged').length >= 2", 30)
            marked = page.eval_on_selector_all("li.marker.diverged",
                                               "nodes => nodes.map(n => n.dataset.run)")
            assert set(marked) == diverging
            _wait(page, "document.querySelector('#summary').textContent.includes('4/4 done')", 30)
            assert HOSTILE in page.inner_text("#note-list")
            assert HOSTILE in page.inner_text(".question")
            assert page.eval_on_selector_all("script", "nodes => nodes.length") == 3  # ours only
            assert page.eval_on_selector_all("img", "nodes => nodes.length") == 0
            page.goto(base + f"r/{sorted(diverging)[0]}")
            _wait(page, "Number(document.querySelector('#curves').dataset.points) > 0", 30)
            assert page.inner_text("#run-status") == "diverged"
            assert "loss_explosion" in page.inner_text("dl.facts")
            page.goto(base)
            assert HOSTILE in page.inner_text("#campaigns")
            browser.close()
        assert problems == []
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)
    assert server.returncode == 0
