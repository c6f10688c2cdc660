"""What a user installs: the wheel and the sdist hold every package of the source tree, and the
wheel, installed (not editable) into a fresh virtual environment, works from a folder outside
the checkout: every module imports, `campaign --help`, a small plan + run + report on SQLite,
`db upgrade` from nowhere in particular, the dashboard's files, and `reproduce` of an archive.

The fresh environment gets the wheel itself and nothing of the checkout; its dependencies
(torch and the rest, gigabytes) are this test environment's, reached through a path file that
adds their folder without processing its path files, so the editable install of the checkout
is never seen there (the test asserts where ``campaign`` was imported from).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "campaign").rglob("*.py")
    if p.name != "__main__.py" and "versions" not in p.parts and p.name != "env.py"
)
SPEC = """
[campaign]
name = "wheel-check"
question = "Does the installed wheel plan, run, report and reproduce?"
task = "campaign.tasks.digits:build"

[hold]
"loop.microbatch" = 4
"loop.accumulation" = 2
"budget.updates" = 4

[config]
"optimizer.name" = "adamw"
"optimizer.lr" = 1e-3

[validation]
every = 2
metric = "val/accuracy"
mode = "max"

[grid]
seeds = [0]
control = "only"

[[grid.variants]]
name = "only"
"""
IMPORT_ALL = """
import importlib, json, sys
names = json.loads(sys.argv[1])
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = f"{type(error).__name__}: {error}"
import campaign
print(json.dumps({"failed": failed, "file": campaign.__file__}))
"""


def _run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel and the sdist, built as pip builds them from a copy of the checkout's files
    (a build writes build/ and egg-info beside its sources: never into the checkout, and
    never two test workers in one folder)."""
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "campaign", tree / "campaign",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "-q", "-w", out, tree)
    assert done.returncode == 0, done.stderr
    sdist = _run(sys.executable, "-c", "from setuptools import build_meta as b; import sys; "
                 f"print(b.build_sdist({str(out)!r}))", cwd=tree)
    assert sdist.returncode == 0, sdist.stderr
    return next(out.glob("campaign-*.whl")), out / sdist.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def fresh(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment holding the wheel (not editable); its bin folder."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                     "--no-index", "-q", built[0])
    assert installed.returncode == 0, installed.stderr
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                .stdout.strip())
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def _environment(bin_folder: Path, ledger: str) -> dict[str, str]:
    """The fresh environment as an activated venv has it; nothing of the checkout's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{bin_folder}{os.pathsep}{env.get('PATH', '')}",
            "CAMPAIGN_LEDGER": ledger, "VIRTUAL_ENV": str(bin_folder.parent)}


def test_the_wheel_and_the_sdist_hold_every_package(built: tuple[Path, Path]) -> None:
    wheel, sdist = built
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "campaign").rglob("*.py")}
    assert sorted(modules - in_wheel) == []
    for shipped in ("migrations/script.py.mako", "serve/templates/campaign.html",
                    "serve/templates/base.html", "serve/static/dashboard.js",
                    "serve/static/dashboard.css", "serve/static/vendor/uPlot.iife.min.js",
                    "serve/static/vendor/uPlot.LICENSE"):
        assert f"campaign/{shipped}" in in_wheel  # the dashboard works offline
    assert any(n.endswith("licenses/LICENSE") for n in in_wheel)
    with tarfile.open(sdist) as archive:
        in_sdist = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert sorted(modules - in_sdist) == []
    assert {"LICENSE", "README.md", "pyproject.toml"} <= in_sdist


def test_every_module_imports_from_the_installed_wheel(fresh: Path, tmp_path: Path) -> None:
    done = _run(fresh / "python", "-c", IMPORT_ALL, json.dumps(SOURCE_MODULES), cwd=tmp_path,
                env=_environment(fresh, "sqlite:///unused.db"))
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["file"].startswith(str(fresh.parent)), "the test must exercise the wheel"
    assert verdict["failed"] == {}


@pytest.mark.slow
def test_the_installed_command_plans_runs_reports_and_reproduces(fresh: Path,
                                                                 tmp_path: Path) -> None:
    """From a folder outside the checkout, with the wheel's own console script."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "spec.toml").write_text(SPEC)
    env = _environment(fresh, "sqlite:///lab.db")

    def campaign(*args: str) -> subprocess.CompletedProcess[str]:
        done = _run(fresh / "campaign", *args, cwd=work, env=env)
        assert done.returncode == 0, f"campaign {' '.join(args)}: {done.stderr}"
        return done

    assert "Usage: campaign" in campaign("--help").stdout
    campaign("plan", "spec.toml")
    (run,) = json.loads(campaign("runs", "wheel-check", "--format", "json").stdout)
    campaign("run", run["run_id"], "--skip-pilot", "--reason", "wheel check")
    report = json.loads(campaign("report", "wheel-check", "--format", "json", "--output",
                                 "-").stdout)
    assert [r["status"] for r in report["runs"]] == ["completed"]
    campaign("archive", "wheel-check", "--output", "wheel-check.tar.gz")
    reproduced = json.loads(campaign("reproduce", "wheel-check.tar.gz", "--dir", "again",
                                     "--format", "json").stdout)["runs"]
    assert [(r["metrics"], r["weights"]) for r in reproduced] == [("identical", "identical")]
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["again", "campaign-artifacts", "lab.db", "spec.toml", "wheel-check.tar.gz"])


def test_db_upgrade_and_the_dashboard_pages_work_from_anywhere(fresh: Path,
                                                               tmp_path: Path) -> None:
    env = _environment(fresh, "sqlite:///lab.db")
    upgrade = _run(fresh / "campaign", "db", "upgrade", cwd=tmp_path, env=env)
    assert upgrade.returncode == 0, upgrade.stderr
    assert "upgraded from empty to" in upgrade.stderr and (tmp_path / "lab.db").exists()
    served = _run(fresh / "python", "-c", "from campaign.serve import pages; print(len(pages."
                  "render('campaigns.html', campaigns=[], ledger='x', page={'kind': "
                  "'campaigns'})))", cwd=tmp_path, env=env)
    assert served.returncode == 0 and int(served.stdout) > 500, served.stderr
