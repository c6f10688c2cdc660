"""Cases from the hostile run of issue 26 (item 12): each ends as docs/cli.md says, one
line, the contract's exit code, nothing lost."""

from __future__ import annotations

import threading
from pathlib import Path

from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.plan.grid import make_plan, record_plan
from campaign.plan.spec import resolve_spec
from tests.support.loop_helpers import BASE


def test_identical_plans_at_once_are_one_plan(ledger_url: str, ledger: Ledger) -> None:
    """Three identical plans race past the existence check: one records the campaign, the
    others find it and are the same no-op as a plan run twice (no 'duplicate key')."""
    plan = make_plan(resolve_spec(BASE, "<race>"))
    barrier, outcomes = threading.Barrier(3), []

    def planner() -> None:
        with Ledger.open(ledger_url) as mine:
            barrier.wait()
            try:
                outcomes.append(record_plan(mine, plan)[1])
            except Exception as error:
                outcomes.append(error)

    threads = [threading.Thread(target=planner) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(map(str, outcomes)) == ["False", "False", "True"], outcomes
    assert len(ledger.runs("loop")) == 1 and len(ledger.campaigns()) == 1


def test_an_empty_ledger_url_is_refused_not_defaulted(tmp_path: Path, monkeypatch) -> None:
    """``--ledger "$UNSET"`` once fell back to ./campaign.db and created it."""
    monkeypatch.chdir(tmp_path)
    for args in (["--ledger", "", "status", "c"], ["status", "c", "--ledger", " "]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "is empty" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_run_waiting_to_be_resumed_is_left_with_its_eta(ledger: Ledger) -> None:
    """``status`` said "0 left, ETA 0s" while an interrupted run waited to be resumed."""
    from campaign.ledger import StopRecord
    from campaign.ledger.progress import take_snapshot
    from tests.support.loop_helpers import plan_loop

    run_id = plan_loop(ledger)[0]
    claim = ledger.claim_next("loop", "w")
    ledger.finish(run_id, "interrupted", StopRecord("interrupted", 5, "update"))
    del claim
    snapshot = take_snapshot(ledger, "loop")
    assert snapshot.left == 1 and snapshot.resumable == 1
    assert "0 running, 1 left (1 to resume)" in snapshot.summary()


def test_a_note_cannot_become_a_link_in_the_markdown_report() -> None:
    """Rendered by CommonMark the note reads as written; in the Markdown source no
    ``javascript:`` (or data:, vbscript:, file:) scheme and no HTML entity is left for a
    linkifying renderer or an editor's preview to act on."""
    import markdown_it

    from campaign.report.markdown import text

    note = "see javascript:alert(1) or DATA:text/html or jav&#x61;script:x <b>hi</b>"
    source = text(note)
    assert "javascript:" not in source and "DATA:" not in source
    assert "\\&#x61;" in source  # an entity stays the characters written, never decoded
    rendered = markdown_it.MarkdownIt("commonmark").render(source)
    assert "<a " not in rendered and "<b>" not in rendered and "jav&amp;#x61;script" in rendered
    assert "see javascript:alert(1) or DATA:text/html" in rendered


def test_a_password_with_an_unencoded_at_sign_is_never_printed() -> None:
    from campaign.ledger.connections import parse_url

    result = CliRunner().invoke(main, ["--ledger", "postgresql://bob:p@ss@127.0.0.1:1/db",
                                       "runs", "c"])
    assert result.exit_code == 3 and "percent-encode it as %40" in result.stderr
    assert "ss@" not in result.stderr and "p@ss" not in result.stderr
    assert parse_url("postgresql://bob:p%40ss@127.0.0.1:1/db").password == "p@ss"


def test_a_name_with_nul_is_not_found_on_both_engines(ledger: Ledger) -> None:
    """``/c/a%00b`` answered 503 on PostgreSQL (it refuses NUL in text): not found, as on
    SQLite."""
    import pytest

    from campaign.errors import NotFound

    for read in (lambda: ledger.campaign("a\x00b"), lambda: ledger.run("01\x00x"),
                 lambda: ledger.runs("a\x00b")):
        with pytest.raises(NotFound):
            read()


def test_withdraw_takes_several_runs_or_a_variant_all_or_none(ledger: Ledger) -> None:
    from campaign.plan.grid import make_plan, record_plan

    spec = {**BASE, "grid": {"seeds": [0, 1, 2], "control": "a",
                             "variants": [{"name": "a"}, {"name": "b",
                                           "set": {"optimizer.lr": 1e-3}}]}}
    record_plan(ledger, make_plan(resolve_spec(spec, "<withdraw>")))
    runs = ledger.runs("loop").set_index(["variant", "seed"])["run_id"]
    url = ledger.engine.url.render_as_string(hide_password=False)
    started = ledger.claim_next("loop", "w").run_id  # a's seed 0 (oldest planned first)
    other = runs[("a", 1)] if runs[("a", 0)] == started else runs[("a", 0)]
    mixed = CliRunner().invoke(main, ["--ledger", url, "withdraw", other, started,
                                      "--reason", "mistake"])
    assert mixed.exit_code == 2 and "nothing was withdrawn" in mixed.stderr
    assert ledger.run(other).status == "planned"
    both = CliRunner().invoke(main, ["--ledger", url, "withdraw", "--campaign", "loop",
                                     "--variant", "b", "--reason", "b was planned by mistake"])
    assert both.exit_code == 0, both.stderr
    statuses = ledger.runs("loop").set_index("run_id")["status"]
    assert [statuses[runs[("b", s)]] for s in range(3)] == ["withdrawn"] * 3
    assert statuses[other] == "planned"
    alone = CliRunner().invoke(main, ["--ledger", url, "withdraw", "--variant", "b",
                                      "--reason", "x"])
    assert alone.exit_code == 2 and "go together" in alone.stderr


def test_plan_csv_is_one_parseable_table(tmp_path: Path) -> None:
    import csv
    import io

    spec = Path(__file__).parents[1] / "support" / "specs" / "digits-lr.toml"
    result = CliRunner().invoke(main, ["--ledger", f"sqlite:///{tmp_path / 'l.db'}", "plan",
                                       str(spec), "--dry-run", "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 9 and {r["variant"] for r in rows} == {"lr-1e-4", "lr-5e-5", "lr-2e-4"}
    assert {"seed", "config_sha256", "control", "sets", "examples_per_update", "updates"} <= set(
        rows[0])
    assert all(len(r["config_sha256"]) == 64 and r["updates"] == "200" for r in rows)


def test_changing_only_the_pilot_settings_keeps_the_campaign(ledger: Ledger,
                                                            ledger_url: str) -> None:
    import copy

    from campaign.plan.grid import current_pilot_table

    record_plan(ledger, make_plan(resolve_spec(BASE, "<first>")))
    stricter = copy.deepcopy(BASE)
    stricter["pilot"] = {"overfit_factor": 8.0}
    created = record_plan(ledger, make_plan(resolve_spec(stricter, "<pilot>")))[1]
    assert not created and len(ledger.runs("loop")) == 1
    assert current_pilot_table(ledger, "loop") == {"overfit_factor": 8.0}
    again = record_plan(ledger, make_plan(resolve_spec(stricter, "<pilot>")))[1]
    events = ledger.events("loop")
    assert not again and (events["kind"] == "pilot_settings").sum() == 1  # no repeat
    back = record_plan(ledger, make_plan(resolve_spec(BASE, "<first>")))[1]  # the original
    assert not back and current_pilot_table(ledger, "loop") == {}  # back in force, recorded
    other = copy.deepcopy(stricter)
    other["hold"]["budget.updates"] = 13  # a new question
    import pytest

    from campaign.ledger import LedgerInputError

    with pytest.raises(LedgerInputError, match="a new question gets a new name"):
        record_plan(ledger, make_plan(resolve_spec(other, "<other>")))


def test_splits_that_training_cannot_read_are_refused_at_plan(tmp_path: Path) -> None:
    spec = (Path(__file__).parents[1] / "support" / "specs" / "digits-lr.toml").read_text().replace(
        "tests.support.tasks.tiny:build", "tests.support.tasks.odd_splits:build")
    said = {"none": "must return a mapping of split name -> examples, got NoneType",
            "generator": "splits()['train'] is a generator: a split must be a sized",
            "no_val": "splits() has no 'val' split (it has 'train')",
            "negative": "splits()['train'] has no usable length",
            "empty_train": "splits()['train'] is empty"}
    for kind, words in said.items():
        path = tmp_path / f"{kind}.toml"
        path.write_text(spec.replace("[config]\n", f'[config]\n"task.splits" = "{kind}"\n'))
        result = CliRunner().invoke(main, ["--ledger", f"sqlite:///{tmp_path / 'l.db'}", "plan",
                                           str(path), "--dry-run"])
        assert result.exit_code == 2 and words in result.stderr, (kind, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1


def test_frames_have_the_same_dtypes_on_both_engines(sqlite_url: str, postgresql_url: str) -> None:
    """A notebook's code must not change with the engine: every frame of the Ledger API, on
    the same ledger content (nullable columns half empty, a finished and a planned run, a
    metric, a note, a pilot with a phase), has the same columns and dtypes."""
    from campaign.ledger import StopRecord
    from campaign.report.balance import balance_sheet
    from tests.support.helpers import plan_campaign

    kinds = {}
    for url in (sqlite_url, postgresql_url):
        with Ledger.open(url, create=True) as opened:
            record = plan_campaign(opened, seeds=2)
            claim = opened.claim_next(record.name, "w")
            with opened.metric_writer(claim.run_id, claim.segment_id) as writer:
                writer.log("train/loss", 1, 0.5, examples_seen=4)
                writer.log("val/accuracy", 1, float("nan"))
            opened.finish(claim.run_id, "completed", StopRecord("budget_reached", 1, "update"))
            opened.add_note(record.name, "n")
            pilot = opened.create_pilot(record.name, record.spec_sha256)
            opened.add_phase_measurements([{"pilot_id": pilot, "phase": "data",
                                            "device": "cpu", "duration_s": 0.1}])
            opened.set_pilot_verdict(pilot, "pass")
            frames = {name: getattr(opened, name)(record.name) for name in (
                "runs", "metrics", "events", "segments", "artifacts", "pilots", "phases",
                "notes")}
            frames["campaigns"] = opened.campaigns()
            sheet = balance_sheet(opened, record.name)
            frames |= {f"balance.{name}": frame for name, frame in sheet.frames().items()}
            kinds[url] = {n: dict(f.dtypes.astype(str)) for n, f in frames.items()}
    assert kinds[sqlite_url] == kinds[postgresql_url]


def test_terminal_escapes_in_a_member_name_or_a_path_are_shown_not_acted_on(
    tmp_path: Path,
) -> None:
    """An archive member named with an ANSI escape, a spec path with one: the error line
    shows ``\\x1b``, never the escape itself."""
    from tests.report.test_archive_safety import GOOD, PREFIX, _archive

    hostile = [*GOOD, (f"{PREFIX}/\x1b[2J\x1b]0;owned\x07.txt", b"x")]
    path = _archive(tmp_path / "a.tar.gz", hostile, {"spec_sha256": "0" * 64, "members": {
        n: {"sha256": "0" * 64, "bytes": len(d)} for n, d in GOOD}})
    result = CliRunner().invoke(main, ["verify-archive", str(path)])
    assert result.exit_code == 1 and "\x1b" not in result.stderr and "\\x1b[2J" in result.stderr
    spec = tmp_path / "bad\x1b[31m.toml"
    spec.write_text("not toml [")
    planned = CliRunner().invoke(main, ["--ledger", f"sqlite:///{tmp_path / 'l.db'}", "plan",
                                        str(spec), "--dry-run"])
    assert planned.exit_code == 2 and "\x1b" not in planned.stderr, planned.stderr
    assert "\\x1b[31m" in planned.stderr


def test_an_archive_of_a_spec_given_as_text_verifies(ledger: Ledger, tmp_path: Path) -> None:
    """``create_campaign(spec=TEXT)`` stores and hashes the text as given: the archive holds
    those bytes, and verify-archive matches them to the manifest's spec_sha256."""
    from campaign.ledger import NewRun, NewVariant
    from campaign.report.archive import write_archive
    from campaign.report.archive_check import verify_archive

    ledger.create_campaign("texted", question="q", task="campaign.tasks.digits:build",
                           spec='{"b": 2,  "a": 1}', variants=[NewVariant("c", True, {})],
                           runs=[NewRun("c", 0, {"seed": 0})])
    archive = write_archive(ledger, "texted", tmp_path / "texted.tar.gz")
    assert verify_archive(archive).members > 3
