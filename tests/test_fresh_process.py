"""Fresh processes forked from the preloaded interpreter: each answers from a state of its own,
in the asker's directory and environment, and failures come back as one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tests.fresh_state as state
from campaign.loop.fresh_process import MODE_VARIABLE, FreshProcessFailed, run_json

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["preloaded", "spawn"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(MODE_VARIABLE, request.param)
    monkeypatch.chdir(ROOT)
    return str(request.param)


def test_a_fresh_process_sees_only_what_it_was_given(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "COUNTER", 41)  # this process's state: not the fresh one's
    env = {**os.environ, "PROBE_VARIABLE": "given"}
    first = run_json(["-m", "tests.fresh_probe", "a", "b"], env=env)
    second = run_json(["-m", "tests.fresh_probe"], env=env)
    assert first["counter"] == second["counter"] == 0
    assert first["argv"] == ["a", "b"] and second["argv"] == []
    assert first["variable"] == "given" and first["cwd"] == str(ROOT)
    assert len({first["pid"], second["pid"], os.getpid()}) == 3
    assert first["torch_loaded"] is (mode == "preloaded")  # preloaded: torch already there


def test_a_failure_reads_as_its_last_line(mode: str) -> None:
    with pytest.raises(FreshProcessFailed, match=r"^the reason it failed$"):
        run_json(["-m", "tests.fresh_probe", "--fail"])
    with pytest.raises(FreshProcessFailed, match="No module named"):
        run_json(["-m", "tests.no_such_module"])



def test_a_check_can_have_modules_preloaded(mode: str) -> None:
    """A built-in task's heavy modules (transformers) imported once in the preloaded
    interpreter, before it forks the check; spawn mode imports what the check imports."""
    seen = run_json(["-m", "tests.fresh_probe"], preload=["json.tool"])
    assert seen["json_tool_loaded"] is (mode == "preloaded")
    assert run_json(["-m", "tests.fresh_probe"])["json_tool_loaded"] is (mode == "preloaded")
