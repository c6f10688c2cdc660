"""An archive carries what a run read (issue 27, item 4): the task's own source as the run hashed
it, the data files its ``task.*`` settings name (or their hashes past ``--data-limit``), and a
run environment with every installed distribution and the git state with a dirty flag and its
diff. A source edited after the run is refused by name. One real run of the ``campaign init``
skeleton, in a git repository with an uncommitted change."""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import require
from tests.support.launch_helpers import ROOT, in_process, reproduced_elsewhere

NAME = "study"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`campaign ARGS` in ``cwd``, in this process: no command's own process is under test
    here (the runs still train in fresh children of this process's task host)."""
    return in_process(*args, cwd=cwd)


def _process(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`campaign ARGS` as a real process, where what its runs print is under test."""
    return subprocess.run(["campaign", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A study folder with one completed run that names a data file, its source dirty in git."""
    folder = tmp_path_factory.mktemp("inputs") / NAME
    assert _cli(folder.parent, "init", NAME).returncode == 0
    (folder / "data").mkdir()
    (folder / "data" / "labels.csv").write_text("id,label\nflower-0,0\n")
    spec = (folder / "spec.toml").read_text()
    labels = '"task.hidden" = 16\n"task.labels" = "data/labels.csv"'
    spec = spec.replace('"task.hidden" = 16', labels)
    spec = spec.replace('"budget.updates" = 100', '"budget.updates" = 10')
    (folder / "spec.toml").write_text(spec.replace("seeds = [0, 1, 2]", "seeds = [0]"))
    _git(folder, "init", "-q")
    _git(folder, "add", "study_task.py")
    _git(folder, "commit", "-q", "-m", "task")
    task = folder / "study_task.py"
    task.write_text(task.read_text() + "\n# an uncommitted edit\n")
    assert _cli(folder, "plan", "spec.toml").returncode == 0
    run_id = json.loads(_cli(folder, "runs", NAME, "--format", "json").stdout)[0]["run_id"]
    done = _cli(folder, "run", run_id, "--skip-pilot", "--reason", "archive inputs test")
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, run_id


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar  # type: ignore[union-attr]
                if m.isfile()}


def test_the_archive_holds_the_task_source_the_data_and_the_full_environment(
    study: tuple[Path, str], tmp_path: Path
) -> None:
    folder, run_id = study
    archive = tmp_path / "a.tar.gz"
    done = _cli(folder, "archive", NAME, "--output", str(archive))
    assert done.returncode == 0, done.stderr
    assert _cli(folder, "verify-archive", str(archive)).returncode == 0
    members = _members(archive)
    inputs = json.loads(members["inputs.json"])
    (source,) = inputs["task_sources"]
    task_bytes = (folder / "study_task.py").read_bytes()
    assert members[f"{source['member_root']}/study_task.py"] == task_bytes
    assert source["run_ids"] == [run_id] and source["files"] == ["study_task.py"]
    digest = hashlib.sha256(b"study_task.py\0" + hashlib.sha256(task_bytes).digest())
    assert source["sha256"] == digest.hexdigest()
    (data,) = inputs["data"]
    assert data["key"] == "task.labels" and data["value"] == "data/labels.csv"
    labels = (folder / "data" / "labels.csv").read_bytes()
    assert members["inputs/data/labels.csv"] == labels
    assert data["files"] == [{"file": "", "member": "inputs/data/labels.csv", "bytes": len(labels),
                              "sha256": hashlib.sha256(labels).hexdigest()}]
    environment = json.loads(members[f"runs/{run_id}/environment.json"])
    assert environment["task_source"]["sha256"] == source["sha256"]
    assert environment["working_directory"] == str(folder)
    assert environment["distributions"]["torch"] == importlib.metadata.version("torch")
    assert environment["distributions"]["pandas"] == importlib.metadata.version("pandas")
    git = environment["git"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert git["revision"] == head and git["dirty"] is True
    assert "+# an uncommitted edit" in git["diff"]
    assert git["diff_sha256"] == hashlib.sha256(git["diff"].encode()).hexdigest()


def test_past_the_data_limit_a_file_is_listed_by_hash_only(study: tuple[Path, str],
                                                           tmp_path: Path) -> None:
    folder, _ = study
    archive = tmp_path / "a.tar.gz"
    done = _cli(folder, "archive", NAME, "--output", str(archive), "--data-limit", "0")
    assert done.returncode == 0, done.stderr
    members = _members(archive)
    (data,) = json.loads(members["inputs.json"])["data"]
    labels = (folder / "data" / "labels.csv").read_bytes()
    assert data["files"][0]["member"] is None
    assert data["files"][0]["sha256"] == hashlib.sha256(labels).hexdigest()
    assert not any(name.startswith("inputs/") for name in members)
    bad = _cli(folder, "archive", NAME, "--output", str(archive), "--data-limit", "lots")
    assert bad.returncode == 2 and "--data-limit" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_a_task_source_edited_after_the_run_is_refused_by_name(study: tuple[Path, str],
                                                               tmp_path: Path) -> None:
    folder, run_id = study
    task = folder / "study_task.py"
    original = task.read_bytes()
    try:
        task.write_bytes(original + b"# edited after the run\n")
        archive = tmp_path / "a.tar.gz"
        done = _cli(folder, "archive", NAME, "--output", str(archive))
        assert done.returncode == 1 and not archive.exists()
        assert f"run {run_id}" in done.stderr and "changed since the run" in done.stderr
    finally:
        task.write_bytes(original)


def test_the_source_of_a_package_task_is_every_module_of_its_package() -> None:
    """A built-in task: its own module or its own package folder, not the rest of the tool;
    a reference that does not import has no source."""
    from campaign.stack.provenance import task_source

    lm = task_source("campaign.tasks.causal_lm:build")
    assert lm is not None and "campaign/tasks/causal_lm/model.py" in lm["files"]
    assert not any(f.startswith("campaign/loop") for f in lm["files"])
    digits = task_source("campaign.tasks.digits:build")
    assert digits is not None and digits["files"] == ["campaign/tasks/digits.py"]
    assert Path(digits["root"]) == ROOT or (Path(digits["root"]) / "campaign").is_dir()
    assert task_source("no_such_module_here:build") is None


def _repacked(archive: Path, target: Path, name: str, content: bytes) -> None:
    """``archive`` with member ``name`` replaced by ``content`` and its manifest line updated
    to match: a tamper that verify-archive cannot see."""
    members = _members(archive)
    members[name] = content
    manifest = json.loads(members["MANIFEST.json"])
    root = next(iter(manifest["members"])).split("/", 1)[0]
    manifest["members"][f"{root}/{name}"] = {"sha256": hashlib.sha256(content).hexdigest(),
                                             "bytes": len(content)}
    members["MANIFEST.json"] = json.dumps(manifest).encode()
    with tarfile.open(target, "w:gz") as tar:
        for member, data in sorted(members.items(), key=lambda kv: kv[0] != "MANIFEST.json"):
            info = tarfile.TarInfo(f"{root}/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_reproduce_re_executes_the_run_from_the_archive_alone_bit_for_bit(
    study: tuple[Path, str], tmp_path: Path
) -> None:
    """The study folder is moved away first: only the archive is left to read."""
    folder, run_id = study
    archive = tmp_path / "a.tar.gz"
    assert _cli(folder, "archive", NAME, "--output", str(archive)).returncode == 0
    done = reproduced_elsewhere(folder, archive, tmp_path, "--run", run_id)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["runs"]
    assert row["run_id"] == run_id and row["status"] == "completed"
    assert row["metrics"] == "identical" and row["weights"] == "identical"
    assert row["points"] > 10 * 4  # loss, grad norm, lr, units per update and validations
    assert row["weights_sha256"] == row["reproduced_weights_sha256"]
    assert (tmp_path / "again" / "work" / "data" / "labels.csv").is_file()
    again = _cli(tmp_path, "reproduce", str(archive), "--dir", "again")
    assert again.returncode == 2 and "exists" in again.stderr


def test_reproduce_names_a_tampered_member(study: tuple[Path, str], tmp_path: Path) -> None:
    folder, run_id = study
    archive = tmp_path / "a.tar.gz"
    assert _cli(folder, "archive", NAME, "--output", str(archive)).returncode == 0
    members = _members(archive)
    (source,) = json.loads(members["inputs.json"])["task_sources"]
    name = f"{source['member_root']}/study_task.py"
    tampered = tmp_path / "tampered.tar.gz"
    _repacked(archive, tampered, name, members[name].replace(b"hidden", b"hiddem"))
    assert _cli(tmp_path, "verify-archive", str(tampered)).returncode == 0  # the manifest agrees
    done = _cli(tmp_path, "reproduce", str(tampered), "--dir", "t1")
    assert done.returncode == 1
    assert "task source study_task.py does not hash as run" in done.stderr
    assert run_id in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t1").exists()  # nothing ran: the new folder is gone again
    labels = "inputs/data/labels.csv"
    _repacked(archive, tampered, labels, b"id,label\nflower-0,1\n")
    done = _cli(tmp_path, "reproduce", str(tampered), "--dir", "t2")
    assert done.returncode == 1 and "task.labels (data/labels.csv)" in done.stderr
    with tarfile.open(archive) as tar:  # a byte flipped without the manifest: verify names it
        data = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    broken = tmp_path / "broken.tar.gz"
    with tarfile.open(broken, "w:gz") as tar:
        for member, content in data.items():
            if member.endswith("/spec.json"):
                content = content.replace(b'"study"', b'"stuDy"')
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    done = _cli(tmp_path, "reproduce", str(broken), "--dir", "t3")
    assert done.returncode == 1 and "spec.json does not match its SHA-256" in done.stderr
    assert not (tmp_path / "t3").exists()



def test_an_archives_own_task_code_runs_only_when_trusted(study: tuple[Path, str],
                                                          tmp_path: Path) -> None:
    """`reproduce` imports and runs the archive's task: like Hugging Face's
    `trust_remote_code`, it says which files with which SHA-256, and runs them only when
    told to. Refused: exit 2, nothing planned, the new folder gone."""
    folder, _ = study
    archive = tmp_path / "a.tar.gz"
    assert _cli(folder, "archive", NAME, "--output", str(archive)).returncode == 0
    source = (folder / "study_task.py").read_bytes()
    done = _cli(tmp_path, "reproduce", str(archive), "--dir", "untrusted")
    assert done.returncode == 2, done.stderr
    said, refused = done.stderr.strip().splitlines()
    assert said == (f"campaign: the archive's code: study_task.py "
                    f"(sha256 {hashlib.sha256(source).hexdigest()})")
    assert "study_task.py" in refused and "--trust-task-code" in refused
    assert not (tmp_path / "untrusted").exists()
    # Code placed by anything else (a data entry naming a .py file: a `torch.py` would shadow
    # torch in the task host) is the archive's code too, said beside the task's own.
    inputs = json.loads(_members(archive)["inputs.json"])
    planted = json.loads(json.dumps(inputs["data"][0]))
    planted["member_root"], planted["files"][0]["file"] = "data/extra", "torch.py"
    inputs["data"].append(planted)
    _repacked(archive, tmp_path / "shadow.tar.gz", "inputs.json", json.dumps(inputs).encode())
    done = _cli(tmp_path, "reproduce", str(tmp_path / "shadow.tar.gz"), "--dir", "shadow")
    assert done.returncode == 2, done.stderr
    assert "the archive's code: data/extra/torch.py (sha256 " in done.stderr
    assert not (tmp_path / "shadow").exists()


@pytest.mark.parametrize("member, content, said", [
    ("inputs.json", b"{not json", "inputs.json: not JSON"),
    ("runs.parquet", b"PAR1 not a table", "runs.parquet: not the runs' table"),
    ("campaign.json", b"[", "campaign.json: not JSON"),
])
def test_a_malformed_member_is_one_line(study: tuple[Path, str], tmp_path: Path, member: str,
                                        content: bytes, said: str) -> None:
    folder, _ = study
    archive = tmp_path / "a.tar.gz"
    assert _cli(folder, "archive", NAME, "--output", str(archive)).returncode == 0
    _repacked(archive, tmp_path / "m.tar.gz", member, content)
    done = _cli(tmp_path, "reproduce", str(tmp_path / "m.tar.gz"), "--dir", "m",
                "--trust-task-code")
    assert done.returncode == 1 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2  # (the task code said first)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("lead_out", ["../../escaped", "/tmp/escaped-abs", "data/../../../x"])
def test_a_manifest_path_that_leads_out_of_the_folder_is_refused(
        study: tuple[Path, str], tmp_path: Path, lead_out: str) -> None:
    """inputs.json names where each piece goes (it verifies: its manifest line is updated
    too): a path that is absolute or climbs out is refused before anything is written there."""
    folder, _ = study
    archive = tmp_path / "a.tar.gz"
    assert _cli(folder, "archive", NAME, "--output", str(archive)).returncode == 0
    inputs = json.loads(_members(archive)["inputs.json"])
    (entry,) = inputs["data"]
    entry["files"][0]["file"] = lead_out
    _repacked(archive, tmp_path / "out.tar.gz", "inputs.json", json.dumps(inputs).encode())
    work = tmp_path / "deep" / "er"
    work.mkdir(parents=True)
    done = _cli(work, "reproduce", str(tmp_path / "out.tar.gz"), "--dir", "o",
                "--trust-task-code")
    assert done.returncode == 1 and "leaves the reproduction's folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (work / "o").exists() and not (tmp_path / "escaped").exists()
    assert not Path("/tmp/escaped-abs").exists()


def test_the_runs_thread_count_is_applied_and_a_difference_names_the_environment(
        study: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run recorded 3 torch threads (and a torch of its own): its reproduction trains with
    3 whatever this shell says, and a metric that differs (here one planted in the archive)
    is shown with what differs in the environment beside it."""
    import pandas as pd

    from campaign.ledger import Ledger

    folder, run_id = study
    archive = tmp_path / "a.tar.gz"
    assert _cli(folder, "archive", NAME, "--output", str(archive)).returncode == 0
    members = _members(archive)
    environment = json.loads(members[f"runs/{run_id}/environment.json"])
    environment["threads"]["intra_op"], environment["torch"] = 3, "0.0-recorded"
    _repacked(archive, tmp_path / "e.tar.gz", f"runs/{run_id}/environment.json",
              json.dumps(environment).encode())
    metrics = pd.read_parquet(io.BytesIO(members["metrics.parquet"]))
    first = metrics.index[(metrics["key"] == "train/loss") & (metrics["step"] == 1)]
    metrics.loc[first, "value"] = 123.0
    planted = io.BytesIO()
    metrics.to_parquet(planted, index=False)
    _repacked(tmp_path / "e.tar.gz", tmp_path / "d.tar.gz", "metrics.parquet",
              planted.getvalue())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    done = _cli(tmp_path, "reproduce", str(tmp_path / "d.tar.gz"), "--dir", "d", "--run", run_id,
                "--trust-task-code", "--format", "json")
    assert done.returncode == 1, done.stderr
    (row,) = json.loads(done.stdout)["runs"]
    assert row["first_difference"].startswith("train/loss at update 1: 123.0 != ")
    assert "torch: run '0.0-recorded', now " in row["first_difference"]
    assert "torch threads" not in row["first_difference"]  # applied: 3 here too
    with Ledger.open(f"sqlite:///{tmp_path / 'd' / 'ledger.db'}") as ledger:
        runs = ledger.runs(NAME)
        (here,) = runs.loc[runs["started_at"].notna(), "environment"]
    assert here["threads"]["intra_op"] == 3 and os.environ["OMP_NUM_THREADS"] == "1"

def test_a_built_in_task_reproduces_and_its_changed_source_is_named(
    tmp_path: Path,
) -> None:
    """The digits task: its source is this installation's own module, checked, not placed."""
    spec = (ROOT / "examples" / "digits-lr.toml").read_text()
    spec = spec.replace("seeds = [0, 1, 2]", "seeds = [0]")
    spec = spec.replace('"budget.updates" = 200', '"budget.updates" = 20')
    (tmp_path / "spec.toml").write_text(spec)
    assert _cli(tmp_path, "plan", "spec.toml").returncode == 0
    run_id = json.loads(_cli(tmp_path, "runs", "digits-lr", "--format", "json").stdout)[0]["run_id"]
    assert _cli(tmp_path, "run", run_id, "--skip-pilot", "--reason", "test").returncode == 0
    assert _cli(tmp_path, "archive", "digits-lr", "--output", "d.tar.gz").returncode == 0
    done = _cli(tmp_path, "reproduce", "d.tar.gz", "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["runs"]
    assert row["metrics"] == "identical" and row["weights"] == "identical"
    members = _members(tmp_path / "d.tar.gz")
    (source,) = json.loads(members["inputs.json"])["task_sources"]
    assert source["files"] == ["campaign/tasks/digits.py"]
    name = f"{source['member_root']}/campaign/tasks/digits.py"
    changed = tmp_path / "changed.tar.gz"
    _repacked(tmp_path / "d.tar.gz", changed, name, members[name] + b"\n# another version\n")
    done = _cli(tmp_path, "reproduce", str(changed), "--dir", "c1")
    assert done.returncode == 1 and "does not hash as run" in done.stderr


@pytest.mark.slow
def test_a_lora_run_reproduces_with_its_trained_tokenizer_from_the_archive(
    tmp_path: Path,
) -> None:
    """A causal-LM LoRA run on its own JSONL data with a tokenizer it trained: the data and the
    tokenizer (cached under the study's artifacts) come from the archive alone, with the
    study folder moved away, a validation file outside it (an absolute path) included; a
    tokenizer changed in the archive is named."""
    require("transformers", "hf")
    require("peft", "hf")
    from campaign.tasks.causal_lm.instructions import write_splits

    folder, outside = tmp_path / "lm", tmp_path / "elsewhere.jsonl"
    write_splits(folder / "data", items=40)
    (folder / "data" / "val.jsonl").rename(outside)
    shape = {"architecture": '"llama"', "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
             "max_position_embeddings": 64}
    lines = "".join(f'"task.model_config.{k}" = {v}\n' for k, v in shape.items())
    lines += "".join(f'"task.data.{s}" = "data/{s}.jsonl"\n' for s in ("train", "test"))
    lines += f'"task.data.val" = "{outside}"\n'  # outside the study folder: an absolute path
    (folder / "spec.toml").write_text(
        '[campaign]\nname = "lm"\nquestion = "q"\ntask = "campaign.tasks.causal_lm:build"\n'
        '[hold]\n"budget.updates" = 6\n"loop.microbatch" = 2\n"loop.accumulation" = 2\n'
        f'"task.vocab_size" = 300\n"task.max_new_tokens" = 4\n{lines}'
        '[config]\n"optimizer.name" = "adamw"\n"optimizer.lr" = 3e-3\n'
        '[validation]\nevery = 3\nmetric = "val/exact_match"\nmode = "max"\nsample = 2\n'
        '[grid]\nseeds = [0]\ncontrol = "lora"\n[[grid.variants]]\nname = "lora"\n'
        'set = { "task.adapter" = "lora", "task.lora_rank" = 4 }\n')
    assert _cli(folder, "plan", "spec.toml").returncode == 0
    run_id = json.loads(_cli(folder, "runs", "lm", "--format", "json").stdout)[0]["run_id"]
    done = _process(folder, "run", run_id, "--skip-pilot", "--reason", "test")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "leaked semaphore" not in done.stderr and "Loading weights" not in done.stderr
    other = folder / "campaign-artifacts" / "tokenizers" / "another" / "tokenizer.json"
    other.parent.mkdir()
    other.write_text("{}")  # another campaign's, cached beside this one's: not packed
    assert _cli(folder, "archive", "lm", "--output", str(tmp_path / "lm.tar.gz")).returncode == 0
    members = _members(tmp_path / "lm.tar.gz")
    (tokenizer,) = json.loads(members["inputs.json"])["tokenizers"]
    trained = (folder / "campaign-artifacts" / tokenizer["member"]).read_bytes()
    validation = outside.read_bytes()
    assert members[tokenizer["member"]] == trained
    hidden = folder.with_name("hidden")
    folder.rename(hidden)  # the data and the tokenizer's cache go with it, and so does
    outside.rename(hidden / "val.jsonl")  # the validation file from outside the folder
    try:
        done = _cli(tmp_path, "reproduce", "lm.tar.gz", "--dir", "again", "--format", "json")
        changed = tmp_path / "changed.tar.gz"
        _repacked(tmp_path / "lm.tar.gz", changed, tokenizer["member"],
                  trained.replace(b'"unk_token"', b'"unk_tokem"'))
        refused = _cli(tmp_path, "reproduce", str(changed), "--dir", "c1")
    finally:
        (hidden / "val.jsonl").rename(outside)
        hidden.rename(folder)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["runs"]
    assert row["run_id"] == run_id and row["status"] == "completed"
    assert row["metrics"] == "identical" and row["weights"] == "identical"
    assert row["points"] > 6 * 4
    assert (tmp_path / "again" / "artifacts" / tokenizer["member"]).read_bytes() == trained
    assert f"task.data.val = '{outside}' lay outside" in done.stderr
    placed = list((tmp_path / "again" / "work" / "_outside").rglob("*.jsonl"))
    assert [p.read_bytes() for p in placed] == [validation]
    assert refused.returncode == 1 and tokenizer["member"] in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "c1").exists()
