"""Issue 14's list of bad inputs, table-driven: each gets one stderr line without a traceback,
the contract's exit code (2 bad input, 3 ledger, 1 a failed check), and leaves every ledger
row count as it was, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main
from campaign.ledger import Ledger
from campaign.loop.train import execute
from tests.support.loop_helpers import plan_loop, plan_quick
from tests.support.raw import execute as raw

TABLES = ("campaigns", "variants", "runs", "segments", "metrics", "events",
          "phase_measurements", "artifacts", "pilots", "notes")
SPEC = """
[campaign]
name = "bad"
question = "does it refuse?"
task = "tests.support.tasks.quick:build"
[hold]
"loop.microbatch" = 4
"budget.updates" = 4
[config]
"optimizer.name" = "sgd"
"optimizer.lr" = 0.1
[validation]
every = 4
metric = "val/accuracy"
mode = "max"
[stop]
{stop}
[grid]
seeds = [0]
control = "{control}"
{grid}
"""
ONE = '[[grid.variants]]\nname = "only"\n'


def _spec(stop: str = "", grid: str = ONE, control: str = "only", **sections: str) -> str:
    text = SPEC.format(stop=stop, grid=grid, control=control)
    for name, body in sections.items():
        text = text.replace(f"[{name}]\n", f"[{name}]\n{body}\n", 1)
    return text


def _deep_table(depth: int) -> str:
    return _spec(**{"config": '"task.deep" = ' + "{a = " * depth + "1" + "}" * depth})


def _deep_array(depth: int) -> str:
    return _spec(**{"config": '"task.deep" = ' + "[" * depth + "1" + "]" * depth})


def _search(lr: str = "{ log_uniform = [1e-3, 1e-1] }", keep: str = "0.5",
            rungs: str = "[4]", confirm_seeds: str = "[5, 6, 7]") -> str:
    """A halving search over the quick task's learning rate (8 updates: a rung at 4)."""
    search = (f'\n[search]\nmethod = "halving"\ntrials = 4\nrungs = {rungs}\n'
              f"keep = {keep}\nconfirm_seeds = {confirm_seeds}\n"
              f'[search.space]\n"optimizer.lr" = {lr}\n')
    return _spec().replace('"budget.updates" = 4', '"budget.updates" = 8') + search


def _axes(body: str, control: str) -> str:
    return _spec(grid=f"[grid.axes]\n{body}\n", control=control)


SPECS: dict[str, tuple[str, str]] = {  # name -> (spec text, expected words)
    "epochs-inf": (_spec(hold='"budget.epochs" = inf').replace('"budget.updates" = 4\n', ""),
                   "finite"),
    "lr-inf": (_spec(config='"optimizer.lr" = inf').replace('"optimizer.lr" = 0.1\n', ""),
               "optimizer.lr"),
    "clip-inf": (_spec(config='"loop.clip_grad_norm" = inf'), "loop.clip_grad_norm"),
    "axis-nan": (_axes('"task.size" = [nan, 64]', "size-64"), "finite"),
    "epochs-1e300": (_spec(hold='"budget.epochs" = 1e300').replace('"budget.updates" = 4\n', ""),
                     "budget.epochs"),
    "updates-1e12": (_spec().replace('"budget.updates" = 4', '"budget.updates" = 1000000000000'),
                     "budget.updates"),
    "deep-table": (_deep_table(3000), "nested too deeply"),
    "deep-array": (_deep_array(5000), "nested too deeply"),
    "axis-traversal": (_axes('"task.tag" = ["../../evil"]', "tag-x"), "not a name"),
    "axis-quote": (_axes('"task.tag" = ["a\\"b"]', "tag-x"), "not a name"),
    "axis-rtl": (_axes('"task.tag" = ["a\u202eb"]', "tag-x"), "not a name"),
    "axis-300": (_axes(f'"task.tag" = ["{"x" * 300}"]', "tag-x"), "not a name"),
    "axes-1e6": (_axes("\n".join(f'"task.k{i}" = [{", ".join(map(str, range(100)))}]'
                                 for i in range(3)), "k0-0_k1-0_k2-0"), "1,000,000 variants"),
    "unknown-key": (_spec(config='"optimizer.lrr" = 0.1'), "optimizer"),
    "wrong-type": (_spec(config='"loop.last_batch" = 3'), "loop.last_batch"),
    "stall-words": (_spec(stop='stall = "soon"'), "stop.stall"),
    "keep-last-0": (_spec(config='"checkpoint.keep_last" = 0'), "checkpoint.keep_last"),
    "microbatch-0": (_spec().replace('"loop.microbatch" = 4', '"loop.microbatch" = 0'),
                     "loop.microbatch"),
    "no-task": (_spec().replace("tests.support.tasks.quick:build",
                                "tests.support.tasks.nosuch:build"),
                "campaign.task"),
    "no-variant": (_spec(grid=""), "grid"),
    "wall-time-words": (_spec(stop='wall_time = "5 minutes"'), "stop.wall_time"),
    "held-changed": (_spec(grid=ONE + '[[grid.variants]]\nname = "b"\n'
                                      'set = { "budget.updates" = 8 }\n'), "budget.updates"),
    "not-toml": ("[campaign\nname = ", "not valid TOML"),
    "search-inverted": (_search(lr="{ log_uniform = [1e-1, 1e-3] }"), "empty or inverted"),
    "search-empty-range": (_search(lr="{ uniform = [0.1, 0.1] }"), "empty or inverted"),
    "search-two-forms": (_search(lr="{ uniform = [0.1, 0.2], int = [1, 2] }"),
                         "exactly one of"),
    "search-unknown-key": (_search(lr="{ uniform = [0.1, 0.2] }").replace(
        '"optimizer.lr" = {', '"optimizer.lrr" = {'), 'search.space."optimizer.lrr"'),
    "search-out-of-range": (_search(lr="{ uniform = [0.1, 2.0] }").replace(
        '"optimizer.lr" = {', '"optimizer.momentum" = {'), 'search.space."optimizer.momentum"'),
    "search-keep": (_search(keep="1.0"), "search.keep"),
    "search-rung-budget": (_search(rungs="[8]"), "search.rungs[0]"),
    "search-rung-step": (_search(rungs="[2]"), "not a validation step"),
    "search-confirm-overlap": (_search(confirm_seeds="[0, 5, 6]"), "search.confirm_seeds[0]"),
    "search-method": (_search().replace('method = "halving"', 'method = "bayes"'),
                      "search.method"),
    "search-patience": (_search().replace("[stop]\n", "[stop]\npatience = 2\n"),
                        "stop.patience = 0"),
    "search-confirm-many": (_search().replace("trials = 4\n", "trials = 4\nconfirm = 9\n"),
                            "search.confirm: 9 variants to confirm, of 4"),
    "search-unquoted-key": (_search().replace('"optimizer.lr" = {', "optimizer.lr = {"),
                            '"optimizer.lr" = { log_uniform'),
    # a task's own order asked of a task without one; an offset past the validation period
    "task-order-missing": (_spec(hold='"loop.sampling" = "task"'), "training_order"),
    "task-order-epochs": (_spec(hold='"loop.sampling" = "task"\n"budget.epochs" = 2').replace(
        '"budget.updates" = 4\n', ""), "budget.updates"),
    "validation-offset": (_spec(validation="offset = 4"), "validation.offset"),
}


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[dict], list[str]]
    code: int
    words: str


def _cases() -> list[Case]:
    cases = [Case(f"plan {name}", lambda s, n=name: ["plan", s["specs"][n], "--dry-run"], 2, w)
             for name, (_, w) in SPECS.items()]
    cases += [Case(f"plan! {name}", lambda s, n=name: ["plan", s["specs"][n]], 2, w)
              for name, (_, w) in list(SPECS.items())[:6]]  # writing plans too
    cases += [
        Case("plan /dev/zero", lambda s: ["plan", "/dev/zero", "--dry-run"], 2, "not a regular"),
        Case("plan a folder", lambda s: ["plan", s["tmp"], "--dry-run"], 2, "is a directory"),
        Case("plan missing", lambda s: ["plan", s["tmp"] + "/no.toml"], 2, "no such spec"),
        Case("plan binary", lambda s: ["plan", s["binary"]], 2, "cannot read the spec"),
    ]
    for item, words in [("optimizer.lrr=0.1", "--set optimizer.lrr"),
                        ("loop.microbatch=0", "--set loop.microbatch"),
                        ("loop.microbatch", "KEY=VALUE"),
                        ("grid.variants=[]", "grid.variants is a list of tables"),
                        ("grid.seeds=[-1]", "--set grid.seeds"),
                        ("stop.wall_time=soon", "--set stop.wall_time"),
                        ("optimizer.lr=inf", "finite"),
                        ("9lives=1", "dotted names")]:
        cases.append(Case(f"plan --set {item[:24]}",
                          lambda s, i=item: ["plan", s["good"], "--set", i], 2, words))
    relaunch = ["relaunch", "{run}", "--reason", "why"]
    for item, words in [("optimizer.lr=inf", "finite"), ("optimizer.lr=nan", "finite"),
                        ("optimizer.lr", "KEY=VALUE"), ("loop={microbatch=1}", "not a table"),
                        ("task.deep=" + "[" * 3000 + "]" * 3000, "nested too deeply"),
                        ("loop.microbatch=0", "loop.microbatch"), ("nosuch.key=1", "nosuch"),
                        ("task.x=" + "9" * 20000, "characters long")]:
        cases.append(Case(f"relaunch --set {item[:24]}",
                          lambda s, i=item: [a.format(**s) for a in relaunch] + ["--set", i],
                          2, words))
    cases += [
        Case("relaunch unknown", lambda s: ["relaunch", "01NOSUCH", "--reason", "x"], 2,
             "01NOSUCH"),
        Case("relaunch blank reason", lambda s: ["relaunch", s["run"], "--reason", " "], 2,
             "--reason"),
        Case("bad port", lambda s: ["--ledger", "postgresql://u:pw@127.0.0.1:notaport/x",
                                    "campaigns"], 3, "malformed ledger URL"),
        Case("bad url", lambda s: ["--ledger", "nonsense", "campaigns"], 3, "malformed"),
        Case("mysql url", lambda s: ["--ledger", "mysql://r@h/x", "campaigns"], 3, "unsupported"),
        Case("no such dir", lambda s: ["--ledger", "sqlite:////no/such/dir/x.db", "runs", "x"],
             3, "no ledger at /no/such/dir/x.db"),
        Case("db upgrade nonsense", lambda s: ["db", "upgrade", "nonsense"], 2,
             "unknown revision 'nonsense'"),
        Case("db upgrade empty", lambda s: ["db", "upgrade", ""], 2, "unknown revision"),
        Case("replay missing final", lambda s: ["replay", s["gone"]], 1, "is missing"),
        Case("replay replaced final", lambda s: ["replay", s["swapped"]], 1,
             "where the ledger recorded"),  # (its size tells, unread)
        Case("replay unknown", lambda s: ["replay", "01NOSUCH"], 2, "01NOSUCH"),
        Case("report to /dev/full", lambda s: ["report", "seeded", "--output", "/dev/full"], 2,
             "not a regular file"),
        Case("report under a file", lambda s: ["report", "seeded", "--output",
                                               s["binary"] + "/r.html"], 2, "cannot write"),
        Case("archive to /dev/full", lambda s: ["archive", "seeded", "--output", "/dev/full"], 2,
             "not a regular file"),
        Case("archive under a file", lambda s: ["archive", "seeded", "--output",
                                                s["binary"] + "/a.tar.gz"], 2, "cannot write"),
        Case("report unknown", lambda s: ["report", "nosuch"], 2, "nosuch"),
        Case("report parquet stdout", lambda s: ["report", "seeded", "--format", "parquet",
                                                 "--output", "-"], 2, "parquet"),
        Case("verify missing", lambda s: ["verify-archive", s["tmp"] + "/none.tar.gz"], 2,
             "no such file"),
        Case("verify not a tar", lambda s: ["verify-archive", s["binary"]], 2, "not a readable"),
        Case("demo /proc", lambda s: ["demo", "--dir", "/proc/x"], 2, "cannot write there"),
        Case("demo under a file", lambda s: ["demo", "--dir", s["binary"] + "/d"], 2,
             "cannot write there"),
        Case("heartbeat 0.05", lambda s: ["launch", "seeded", "--heartbeat-s", "0.05"], 2,
             "heartbeat-s"),
        Case("lease < 3 beats", lambda s: ["launch", "seeded", "--heartbeat-s", "1",
                                           "--lease-s", "2"], 2, "at least 3 heartbeats"),
        Case("worker lease", lambda s: ["worker", "seeded", "--lease-s", "0.1"], 2, "lease-s"),
        Case("grace 0", lambda s: ["run", s["run"], "--stop-grace-s", "0"], 2, "stop-grace-s"),
        Case("run unknown", lambda s: ["run", "01NOSUCH"], 2, "01NOSUCH"),
        Case("resume planned", lambda s: ["resume", s["planned"]], 2, "only interrupted"),
        Case("withdraw unknown", lambda s: ["withdraw", "01NOSUCH", "--reason", "x"], 2,
             "01NOSUCH"),
        Case("note blank", lambda s: ["note", "seeded", " "], 2, "needs text"),
        Case("pilot all withdrawn", lambda s: ["pilot", "gone"], 2, "nothing to pilot"),
        Case("size bad memory", lambda s: ["size", "seeded", "--gpu-memory", "lots"], 2,
             "gpu-memory"),
        Case("inspect bad split", lambda s: ["inspect", "seeded", "--split", "nosuch"], 2,
             "nosuch"),
        Case("show unknown", lambda s: ["show", "nosuch"], 2, "nosuch"),
    ]
    return cases


@pytest.fixture
def seeded(ledger_url: str, tmp_path: Path) -> dict:
    """A ledger with a completed run (its final artifact deleted), another whose final was
    replaced, a planned run, and a campaign whose every run is withdrawn."""
    art = tmp_path / "art"
    with Ledger.open(ledger_url, create=True) as ledger:
        gone, swapped, planned = plan_quick(ledger, "seeded", runs=3)
        for run_id in (gone, swapped):
            execute(ledger, run_id, artifacts=art, replay_in_subprocess=False)
        (withdrawn,) = plan_loop(ledger, "gone", task="tests.support.tasks.quick:build")
        ledger.withdraw(withdrawn, "planned by mistake")
    (art / gone / "final.safetensors").unlink()
    (art / swapped / "final.safetensors").write_bytes(b"another file")
    specs = {}
    for name, (text, _) in SPECS.items():
        specs[name] = str(tmp_path / f"{name}.toml")
        Path(specs[name]).write_text(text, encoding="utf-8")
    good = tmp_path / "good.toml"
    good.write_text(_spec().replace('name = "', 'name = "set-', 1), encoding="utf-8")
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    return {"url": ledger_url, "specs": specs, "tmp": str(tmp_path), "binary": str(binary),
            "good": str(good),
            "run": planned, "planned": planned, "gone": gone, "swapped": swapped}


def _counts(url: str) -> dict[str, int]:
    return {t: raw(url, f"SELECT COUNT(*) FROM {t}")[0][0] for t in TABLES}


def test_at_least_sixty_bad_inputs() -> None:
    assert len(_cases()) >= 60


@pytest.mark.slow
def test_every_bad_input_gets_one_line_and_its_exit_code(seeded: dict, tmp_path: Path) -> None:
    url = seeded["url"]
    before = _counts(url)
    problems = []
    for case in _cases():
        args = case.args(seeded)
        if "--ledger" not in args:
            args = ["--ledger", url, *args]
        result = CliRunner().invoke(main, args)
        lines = result.stderr.strip().splitlines()
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        if (result.exit_code != case.code or crashed or len(lines) != 1
                or "Traceback" in result.stderr or case.words not in result.stderr
                or "pw@" in result.stderr):
            problems.append(f"{case.name}: exit {result.exit_code} (want {case.code}), "
                            f"stderr {result.stderr[-300:]!r}, exception {result.exception!r}")
        after = _counts(url)
        if after != before:
            changed = {t: (before[t], after[t]) for t in TABLES if before[t] != after[t]}
            problems.append(f"{case.name}: ledger rows changed {changed}")
            before = after
    assert not problems, "\n".join(problems)
    assert not list(Path("/proc").glob("x")) and Path("/dev/full").is_char_device()
    binary = Path(tmp_path / "binary.bin")  # the refused outputs: nothing made under a file
    assert binary.is_file() and binary.read_bytes() == bytes(range(256)) * 4
    for refused in ("r.html", "a.tar.gz", "d"):
        assert not Path(f"{binary}/{refused}").exists()
    leftovers = [p.name for p in tmp_path.rglob("*.partial")]
    assert leftovers == []


def test_a_corrupted_page_is_named_by_doctor_and_by_every_read(sqlite_url: str) -> None:
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with Ledger.open(sqlite_url, create=True) as ledger:
        (run_id,) = plan_quick(ledger, "damaged", runs=1, updates=40)
        execute(ledger, run_id, artifacts=path.parent / "art", replay_in_subprocess=False)
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = [row[0] for row in conn.execute("SELECT pageno FROM dbstat WHERE name = 'metrics'")]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(path, "r+b") as handle:  # the metrics table's pages damaged
        for page in pages:
            handle.seek((page - 1) * size + 100)
            handle.write(b"\xde\xad\xbe\xef" * 200)
    doctor = CliRunner().invoke(main, ["--ledger", sqlite_url, "doctor", "--format", "json"])
    assert doctor.exit_code == 1 and "the ledger is damaged" in doctor.stderr
    assert len(doctor.stderr.strip().splitlines()) == 1
    for command in (["report", "damaged", "--output", str(path.parent / "r.html")],
                    ["archive", "damaged", "--output", str(path.parent / "a.tar.gz")]):
        result = CliRunner().invoke(main, ["--ledger", sqlite_url, *command])
        assert result.exit_code == 3, (command, result.stderr, result.exception)
        assert "is corrupted" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (path.parent / "a.tar.gz").exists()
