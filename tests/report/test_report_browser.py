"""The HTML report in a real headless Chromium: no console error, content drawn, text escaped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from campaign.ledger import Ledger
from campaign.report.balance import balance_sheet
from campaign.report.render import write
from tests.conftest import REQUIRE_ALL
from tests.support.helpers import plan_campaign

pytestmark = pytest.mark.browser

HOSTILE = "<script>alert(1)</script>"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(autouse=True)
def _chromium_here() -> None:
    """Checked when a test runs, not at import: `make test-fast` deselects these tests on a
    machine that has no Chromium yet, and a failing import would fail it anyway."""
    if CHROMIUM is None:
        if REQUIRE_ALL:  # set by `make test`, which installs it
            raise RuntimeError("CAMPAIGN_REQUIRE_ALL is set but chromium is not installed")
        pytest.skip("capability: no chromium on this machine")


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120,
    )


def test_html_report_renders_in_headless_chromium(sqlite_ledger: Ledger, tmp_path: Path) -> None:
    record = plan_campaign(sqlite_ledger, "browser", seeds=2,
                           variants={HOSTILE: 1e-4, "other": 2e-4})
    for _ in record.run_ids:  # real curves, written through the API as a notebook would
        claim = sqlite_ledger.claim_next("browser", "test")
        with sqlite_ledger.metric_writer(claim.run_id, claim.segment_id) as metrics:
            for step in range(1, 21):
                metrics.log("train/loss", step, 2.0 / step, 16 * step)
                if step % 5 == 0:
                    metrics.log("val/loss", step, 2.5 / step, 16 * step)
    sqlite_ledger.add_note("browser", f"a note with {HOSTILE} in it")
    report = write(balance_sheet(sqlite_ledger, "browser"), "html", tmp_path / "report.html")
    url = report.resolve().as_uri()

    shot = tmp_path / "shot.png"
    drawn = _chromium("--window-size=1400,2400", f"--screenshot={shot}", url)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    console = [line for line in drawn.stderr.splitlines() if "CONSOLE" in line]
    assert console == []  # no script error, no blocked fetch, no CSP violation
    histogram = Image.open(shot).convert("L").histogram()  # 256 grey levels
    dark = sum(histogram[:200]) / sum(histogram)
    assert 0.01 < dark < 0.9, dark  # text, tables and the curves are drawn; not blank

    dom = _chromium("--dump-dom", url)
    assert dom.returncode == 0
    text = dom.stdout
    assert "<table" in text and text.count("data:image/png;base64,") >= 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # shown as text
    assert HOSTILE not in text and "<script" not in text.lower()


def test_conclusion_flags_and_relaunches_in_chromium_and_the_run_table_fits(
    sqlite_ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The honest campaign of test_conclusions, read in Chromium's DOM: the answer and the
    flags come first, the withdrawn run and both relaunches are there, and the layout at
    1,400 px has no horizontal overflow (measured by a copy of the page with a script)."""
    from tests.report.test_conclusions import _build

    ids = _build(sqlite_ledger, tmp_path, monkeypatch)
    report = write(balance_sheet(sqlite_ledger, "honest"), "html", tmp_path / "honest.html")
    dom = _chromium("--dump-dom", report.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = dom.stdout
    order = [text.index(f'id="{part}"') for part in ("conclusion", "flags", "variants", "runs")]
    assert order == sorted(order)  # the answer and the flags before the evidence
    answer = text.split('class="conclusion">')[1].split("</p>")[0]
    assert answer.startswith("Which learning rate") and "lr-3e0: no valid runs" in answer
    flags = text.split('id="flags"')[1].split('id="variants"')[0]
    for kind in ("replay_differs", "pilot_skipped", "changes_variant_key", "held_deviation"):
        assert kind in flags, kind
    assert '<tr class="withdrawn">' in text and ids["mistake"] in text
    relaunches = text.split('id="relaunches"')[1].split('id="runs"')[0]
    assert ids["tamed"] in relaunches and ids["same"] in relaunches
    assert "optimizer.lr: 3 -&gt; 0.01" in relaunches
    assert "no_valid_runs" in text and "MiB" in text and "rss_peak 5" not in text
    assert "&amp;lt;" not in text  # nothing escaped twice

    # Layout: the same page with a script that writes the widths into the title.
    measured = tmp_path / "measured.html"
    page = report.read_text().replace('<meta http-equiv="Content-Security-Policy"', "<meta x")
    probe = ("<script>window.onload = () => { const t = document.getElementById('run-table');"
             " document.title = 'W' + Math.round(t.getBoundingClientRect().right) + ' S' +"
             " document.documentElement.scrollWidth; };</script></body>")
    measured.write_text(page.replace("</body>", probe))
    laid = _chromium("--window-size=1400,1000", "--dump-dom", measured.resolve().as_uri())
    title = laid.stdout.split("<title>")[1].split("</title>")[0]
    right, scroll = (int(part[1:]) for part in title.split())
    assert right <= 1400 and scroll <= 1400, title
