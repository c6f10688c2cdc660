"""The task host: fresh children that answer from a state of their own, in the asker's
directory and environment; failures as one clear line; a host that ignores the scheduler's
signals, dies with its owner, and takes its children with it."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tests.support.fresh_state as state
from campaign.errors import TaskContractError
from campaign.host import calls, client
from campaign.host.calls import FreshProcessFailed, run_module
from campaign.host.processes import process_state
from campaign.stack.software import thread_settings
from tests.support.fresh_probe import imported_at_start

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_a_fresh_child_sees_only_what_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "COUNTER", 41)  # this process's state: not the fresh one's
    env = {**os.environ, "PROBE_VARIABLE": "given"}
    first = run_module(["-m", "tests.support.fresh_probe", "a", "b"], env=env)
    second = run_module(["-m", "tests.support.fresh_probe"], env=env)
    assert first["counter"] == second["counter"] == 0
    assert first["argv"] == ["a", "b"] and second["argv"] == []
    assert first["variable"] == "given" and first["cwd"] == str(ROOT)
    assert len({first["pid"], second["pid"], os.getpid()}) == 3
    assert first["torch_loaded"] is True  # the host imported it; the child did not pay
    assert first["server"] == second["server"] == client.current().process.pid


def test_a_failure_reads_as_its_last_line() -> None:
    with pytest.raises(FreshProcessFailed, match=r"^the reason it failed$"):
        run_module(["-m", "tests.support.fresh_probe", "--fail"])
    with pytest.raises(FreshProcessFailed, match="No module named"):
        run_module(["-m", "tests.no_such_module"])


def test_a_check_can_have_modules_preloaded() -> None:
    """Modules a request names are imported once in the host and inherited by later children."""
    probed = run_module(["-m", "tests.support.fresh_probe"], preload=["json.tool"])
    assert probed["json_tool_loaded"]
    assert run_module(["-m", "tests.support.fresh_probe"])["json_tool_loaded"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("import sys\nsys.exit(0)\n", r"raised SystemExit\(0\) while importing"),
        ("import os\nos._exit(0)\n", r"ended its process \(exited with status 0\) while importing"),
        ("import time\ntime.sleep(60)\n", r"did not return within 2 s while importing"),
        ("raise RuntimeError('broken at import')\n", r"failed while importing.*broken at import"),
    ],
)
def test_task_code_that_exits_or_hangs_at_import_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, expected: str
) -> None:
    module = f"hostile_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(calls.TIMEOUT_ENV, "2")
    with pytest.raises(TaskContractError, match=expected):
        calls.call(importlib.import_module, module, what="importing the task")


def test_the_host_ignores_the_schedulers_signals_and_dies_with_its_owner(tmp_path: Path) -> None:
    """An owner process with a host and a sleeping child: every signal SLURM or a terminal
    sends reaches the host and leaves it serving; the owner's death ends host and child."""
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from campaign.host import calls, client
        child = calls.start(time.sleep, [600])
        print(client.current().process.pid, child.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert owner.stdout is not None
    host, child = (int(p) for p in owner.stdout.readline().split())
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        os.kill(host, signum)
    time.sleep(0.5)
    assert process_state(host) not in (None, "Z", "X")
    assert process_state(child) not in (None, "Z", "X")
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (process_state(host) or process_state(child)):
        time.sleep(0.1)
    assert process_state(host) is None and process_state(child) is None


MEMBER = textwrap.dedent("""
    import os, sys, time
    from campaign.host import calls, client
    child = calls.start(time.sleep, [600])
    print(child.pid, os.environ.get(client.SHARED_HOST, "-"), flush=True)
    time.sleep(600)
""")


def _ppid(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def _gone(pid: int, within_s: float = 10) -> bool:
    """Whether ``pid`` is gone (ended and reaped) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and process_state(pid) is not None:
        time.sleep(0.05)
    return process_state(pid) is None


def test_members_share_one_host_and_a_killed_members_children_die_with_it() -> None:
    """A local launch's workers join their launcher's host (``CAMPAIGN_SHARED_HOST``): their
    children fork from that one host (no interpreter of their own), the variable is gone from
    what they start, and a member killed with SIGKILL takes its children along, leaving the
    other member's running."""
    env = {**os.environ, client.SHARED_HOST: client.share_path()}
    members = [subprocess.Popen([sys.executable, "-c", MEMBER], env=env, stdout=subprocess.PIPE,
                                text=True, cwd=ROOT) for _ in range(2)]
    try:
        answers = [member.stdout.readline().split() for member in members]  # type: ignore[union-attr]
        children = [int(pid) for pid, _ in answers]
        assert [seen for _, seen in answers] == ["-", "-"]  # nothing they start joins by mistake
        host = client.current().process.pid
        assert [_ppid(child) for child in children] == [host, host]
        members[0].kill()
        members[0].wait()
        assert _gone(children[0])
        assert _alive(children[1]) and _alive(host)
    finally:
        for member in members:
            member.kill()
            member.wait()
    assert _gone(children[1])


OWN_HOST = textwrap.dedent("""
    import time
    from campaign.host import calls, client
    calls.start(time.sleep, [0]).join()
    print(client.current().process is not None)  # it spawned this host itself
""")
OWNER = textwrap.dedent("""
    import time
    from campaign.host import calls, client
    child = calls.start(time.sleep, [600])
    print(client.share_path(), client.current().process.pid, child.pid, flush=True)
    time.sleep(600)
""")


def test_a_shared_host_outlives_its_killed_owner_while_a_member_is_left() -> None:
    """A launcher killed with SIGKILL leaves its workers' runs running: the shared host kills
    the owner's own children, takes no new member, and serves its members until the last
    one goes, then ends with what is left."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)
    member = None
    try:
        address, host, owners_child = owner.stdout.readline().split()  # type: ignore[union-attr]
        env = {**os.environ, client.SHARED_HOST: address}
        member = subprocess.Popen([sys.executable, "-c", MEMBER], env=env,
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT)
        members_child = int(member.stdout.readline().split()[0])  # type: ignore[union-attr]
        assert _ppid(members_child) == int(host)
        owner.kill()
        owner.wait()
        assert _gone(int(owners_child))
        time.sleep(1.5)  # three of the host's owner polls
        assert _alive(members_child) and _alive(int(host))
        late = subprocess.run([sys.executable, "-c", OWN_HOST], env=env, capture_output=True,
                              text=True, cwd=ROOT, timeout=120)
        assert late.returncode == 0, late.stderr
        assert late.stdout.strip() == "True"  # no member joins once the owner is gone
        member.kill()
        member.wait()
        assert _gone(members_child) and _gone(int(host))
    finally:
        for process in (owner, member):
            if process is not None:
                process.kill()
                process.wait()


def test_a_member_whose_host_is_gone_spawns_its_own() -> None:
    """A stale ``CAMPAIGN_SHARED_HOST`` (its launcher ended) is no error: the process starts
    a host of its own, as a worker started by hand does."""
    env = {**os.environ, client.SHARED_HOST: "@campaign-host-0-gone"}
    done = subprocess.run([sys.executable, "-c", OWN_HOST], env=env, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def _mask(pid: int, field: str = "SigBlk") -> int:
    status = (Path("/proc") / str(pid) / "status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith(f"{field}:")]
    return int(line.split()[1], 16)


def test_a_child_receives_signals_its_owner_blocks() -> None:
    """A Ray worker blocks SIGINT (Ray interrupts a task another way) and a mask survives fork
    and exec: the host and its children clear it, or the run never hears its supervisor."""
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import signal, time
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])
        from campaign.host import calls, client
        child = calls.start(time.sleep, [600])
        print(client.current().process.pid, child.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert owner.stdout is not None
    try:
        host, child = (int(p) for p in owner.stdout.readline().split())
        term = 1 << (signal.SIGTERM - 1)
        deadline = time.monotonic() + 10  # the child left the host's ignored signals behind
        while time.monotonic() < deadline and _mask(child, "SigIgn") & term:
            time.sleep(0.05)
        assert _mask(owner.pid) & (1 << (signal.SIGINT - 1))  # the owner still blocks it
        assert _mask(host) == 0 and _mask(child) == 0
        os.kill(child, signal.SIGTERM)  # blocked in the owner; default action in the child
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process_state(child) not in (None, "Z", "X"):
            time.sleep(0.1)
        assert process_state(child) in (None, "Z", "X")
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.parametrize("threads", [None, "1"])
def test_a_host_child_has_the_threads_a_fresh_interpreter_has(
    monkeypatch: pytest.MonkeyPatch, threads: str | None
) -> None:
    """The last float32 bit of a reduction can depend on torch's thread counts: a child forked
    from the host (which never ran an operator) must get what a new interpreter gets from the
    same environment."""
    import json

    if threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
    hosted = calls.call(thread_settings, what="reading thread settings")
    fresh = subprocess.run(
        [sys.executable, "-c", "import json; from campaign.stack.software import thread_settings; "
                               "print(json.dumps(thread_settings()))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    assert hosted == json.loads(fresh.stdout)
    if threads is not None:
        assert hosted["intra_op"] == 1


def test_a_user_task_names_the_libraries_its_host_imports_once() -> None:
    """A user's task module names libraries in ``PRELOAD``: the host reads the tuple from its
    source and imports them before it forks, so every child starts with them (scikit-learn
    would take each of them 1.5 s); the task's own module is never imported in the host (its
    import-time code runs in a child). A task without ``PRELOAD`` preloads nothing."""
    library, task = "tests.support.tasks.preloaded_library", "tests.support.tasks.preloading"
    for _ in range(2):  # each child starts with the library
        seen = calls.call(imported_at_start, [library, task],
                          what="probing", task=f"{task}:build")
        assert seen == {library: True, task: False}
    assert calls.call(imported_at_start, ["tests.support.tasks.tied"],
                      what="probing", task="tests.support.tasks.quick:build") == {
                          "tests.support.tasks.tied": False}
    from campaign.host.preloads import declared_preloads

    assert declared_preloads(task) == [library]
    assert declared_preloads("tests.support.tasks.quick") == []
    assert declared_preloads("no.such.module") == []


def test_a_daemon_a_preloaded_library_starts_ends_with_the_host(tmp_path: Path) -> None:
    """A library a task names in ``PRELOAD`` starts a process at import: in the probe child
    and then in the host itself. Neither outlives its command (the probe's ended with the
    probe, the host's with the host): both used to be left running, ignoring SIGTERM."""
    pids = tmp_path / "pids"
    (tmp_path / "starting_library.py").write_text(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pids)!r}, 'a').write(f'{{child.pid}}\\n')\n")
    (tmp_path / "starting_task.py").write_text("PRELOAD = ('starting_library',)\n"
                                               "def build(config):\n    return None\n")
    owner = textwrap.dedent("""
        import importlib, sys
        from campaign.host import calls
        calls.call(importlib.import_module, "json", what="probing", task="starting_task:build")
    """)
    done = subprocess.run([sys.executable, "-c", owner], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2  # the probe's, the host's
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(process_state(p) not in (None, "Z")
                                              for p in started):
        time.sleep(0.1)
    assert all(process_state(p) in (None, "Z") for p in started), started


@pytest.mark.slow
def test_a_declared_library_that_hangs_keeps_to_the_task_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's probe of a declared library waits no longer than the requester's
    ``CAMPAIGN_TASK_TIMEOUT_S`` (it waited 60 s whatever the limit): a library that hangs at
    import ends the call with the limit's error in about twice the limit, the probe's and
    the child's own."""
    library = f"hanging_library_{os.getpid()}"
    (tmp_path / f"{library}.py").write_text("import time\ntime.sleep(120)\n")
    (tmp_path / "hanging_task.py").write_text(f"PRELOAD = ({library!r},)\n"
                                              "def build(config):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(calls.TIMEOUT_ENV, "3")
    began = time.monotonic()
    with pytest.raises(TaskContractError, match="did not return within 3 s"):
        calls.call(importlib.import_module, library, what="importing the task",
                   task="hanging_task:build")
    assert time.monotonic() - began < 20


DAEMON = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(PIDS, "a") as out:  # a subprocess, in the child's process group
    out.write(f"{helper.pid}\\n")
if os.fork() == 0:  # a daemon: a new session, a double fork, its parent gone
    os.setsid()
    if os.fork() == 0:
        with open(PIDS, "a") as out:
            out.write(f"{os.getpid()}\\n")
        time.sleep(300)
    os._exit(0)
time.sleep(0.5)
"""


def test_a_daemon_task_code_forks_at_import_ends_with_its_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `plan` asks the task runs in a guarded child; a daemon the task module starts at
    import (a subprocess, a setsid double fork) used to outlive the command. The child reaps
    its orphans (a subreaper) and ends every descendant with itself."""
    pids = tmp_path / "pids"
    module = f"daemon_task_{os.getpid()}"
    (tmp_path / f"{module}.py").write_text(f"PIDS = {str(pids)!r}\n" + DAEMON)
    monkeypatch.syspath_prepend(str(tmp_path))
    calls.call(importlib.import_module, module, what="importing the task")
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(process_state(p) not in (None, "Z")
                                              for p in started):
        time.sleep(0.1)
    assert all(process_state(p) in (None, "Z") for p in started), started


def test_a_declared_library_that_exits_at_import_is_never_the_hosts() -> None:
    """The host imports a user's declared library only after a probe child imported it and
    exited 0: one that ends its process at import leaves the host serving, and is not tried
    again; a ``PRELOAD`` that names the task's own module never imports it in the host."""
    exiting, task = "tests.support.tasks.exiting_library", "tests.support.tasks.preloading_badly"
    for _ in range(2):
        seen = calls.call(imported_at_start, [exiting, task],
                          what="probing", task=f"{task}:build")
        assert seen == {exiting: False, task: False}
    from campaign.host.preloads import declared_preloads

    assert declared_preloads(task) == [exiting, task]  # an annotated assignment counts too


def test_a_declared_preload_is_found_as_python_finds_the_module(tmp_path: Path) -> None:
    """Read from the source without importing: a package wins over a module of one name, a
    regular package over a namespace portion, the last top-level assignment counts (annotated
    too), anything but a literal tuple or list of names declares nothing, and relative path
    entries are the requester's directory's."""
    from campaign.host.preloads import declared_preloads, import_path, task_preloads

    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    (tmp_path / "study" / "task.py").write_text('PRELOAD = ("a",)\nPRELOAD: tuple = ("b", "c")\n')
    (tmp_path / "study" / "twin").mkdir()
    (tmp_path / "study" / "twin" / "__init__.py").write_text('PRELOAD = ["package"]\n')
    (tmp_path / "study" / "twin.py").write_text('PRELOAD = ["module"]\n')
    (tmp_path / "study" / "odd.py").write_text('PRELOAD = tuple(["x"])\n')
    (tmp_path / "study" / "inside.py").write_text(
        'PRELOAD = ("study.inside.helpers", "study", "d")\n')
    assert declared_preloads("study.task", [str(tmp_path)]) == ["b", "c"]
    assert declared_preloads("study.twin", [str(tmp_path)]) == ["package"]
    assert declared_preloads("study.odd", [str(tmp_path)]) == []
    assert task_preloads("study.inside:build", [str(tmp_path)]) == ([], ["d"])  # never its own
    path = import_path({"cwd": str(tmp_path), "path": ["relative", "/abs"]})
    assert path[:2] == [str(tmp_path / "relative"), "/abs"] and str(tmp_path) in path
    assert "study" not in sys.modules


@pytest.mark.parametrize("body", ["import time\ntime.sleep(30)\n", "import os\nos._exit(0)\n",
                                  "raise ImportError('no')\n"])
def test_a_probe_that_hangs_exits_or_fails_says_no(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    """The host imports a declared library only when its probe imported it within the limit
    and exited 0 on its own: a hang (killed at the limit), an exit at import, a failure."""
    from campaign.host import preloads

    (tmp_path / "probed_library.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(preloads, "PROBE_LIMIT_S", 1.0)
    began = time.monotonic()
    assert not preloads._imports_cleanly("probed_library")  # False, or None past the limit
    assert time.monotonic() - began < 10
    assert "probed_library" not in sys.modules
