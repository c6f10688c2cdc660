"""verify-archive refuses hostile archives with the right exit code and bounded memory."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from campaign.cli import main

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "c-archive"
SPEC_SHA256 = hashlib.sha256(b'{"a":1}').hexdigest()  # the canonical JSON of GOOD's spec


def _entry(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _archive(path: Path, members: list[tuple[str, bytes]], manifest: object = None,
             *, links: tuple[str, ...] = ()) -> Path:
    """A .tar.gz with ``members`` and a manifest (by default one listing every member)."""
    if manifest is None:
        manifest = {"campaign": "c", "spec_sha256": SPEC_SHA256,
                    "members": {n: _entry(d) for n, d in members}}
    document = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [(f"{PREFIX}/MANIFEST.json", document), *members]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return path


def _verify(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["verify-archive", str(path)])
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.exit_code, result.stderr


GOOD = [(f"{PREFIX}/spec.json", b'{"a": 1}'), (f"{PREFIX}/campaign.json", b"{}"),
        (f"{PREFIX}/notes.json", b"[]")]


def test_a_well_formed_archive_verifies(tmp_path: Path) -> None:
    code, said = _verify(_archive(tmp_path / "ok.tar.gz", GOOD))
    assert code == 0 and "3 members" in said


@pytest.mark.parametrize("name", ["../../../outside.txt", "/outside.txt",
                                  f"{PREFIX}/../../outside.txt"])
def test_names_that_leave_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    code, said = _verify(_archive(tmp_path / "t.tar.gz", [*GOOD, (name, b"pwned")]))
    assert code == 1 and "leaves the archive's folder" in said


def test_a_link_is_refused(tmp_path: Path) -> None:
    path = _archive(tmp_path / "l.tar.gz", GOOD, links=(f"{PREFIX}/passwd",))
    code, said = _verify(path)
    assert code == 1 and "is a link" in said


def test_a_truncated_archive_is_one_line(tmp_path: Path) -> None:
    whole = _archive(tmp_path / "whole.tar.gz", GOOD).read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    code, said = _verify(cut)
    assert code == 1
    assert said == f"campaign: {cut}: damaged .tar.gz archive (unexpected end of data)\n"


def test_a_second_manifest_is_refused(tmp_path: Path) -> None:
    other = json.dumps({"members": {}}).encode()
    code, said = _verify(_archive(tmp_path / "two.tar.gz", [*GOOD, ("x/MANIFEST.json", other)]))
    assert code == 1 and "a second manifest" in said


def test_a_tampered_member_followed_by_the_genuine_one_is_refused(tmp_path: Path) -> None:
    genuine = GOOD[0]
    members = [(genuine[0], b'{"a": 2}'), *GOOD]
    manifest = {"members": {n: _entry(d) for n, d in GOOD}}
    code, said = _verify(_archive(tmp_path / "d.tar.gz", members, manifest))
    assert code == 1 and "appears twice" in said


@pytest.mark.parametrize(
    ("manifest", "where"),
    [
        (["a", "b"], "the document"),
        ("members", "the document"),
        ({"campaign": "c"}, "members"),
        ({"members": {f"{PREFIX}/spec.json": "abc"}}, "members"),
        ({"members": {f"{PREFIX}/spec.json": {"sha256": "xyz", "bytes": 8}}}, "sha256"),
        (b"{not json", "the document"),
    ],
)
def test_malformed_manifests_are_unusable_input(
    tmp_path: Path, manifest: object, where: str
) -> None:
    code, said = _verify(_archive(tmp_path / "m.tar.gz", GOOD, manifest))
    assert code == 2 and "MANIFEST.json is malformed" in said and where in said


def test_unusable_paths(tmp_path: Path) -> None:
    assert _verify(tmp_path / "missing.tar.gz")[0] == 2
    text = tmp_path / "notes.tar.gz"
    text.write_text("not an archive")
    code, said = _verify(text)
    assert code == 2 and "not a readable .tar.gz" in said
    assert _verify(_archive(tmp_path / "none.tar.gz", GOOD, {"members": {}}))[0] == 1


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count

    def readable(self) -> bool:
        return True


def _bomb(path: Path, size: int, manifest_first: bool) -> Path:
    """A member of ``size`` zero bytes (a few MB compressed) that the manifest lists at 8."""
    listed = {f"{PREFIX}/{n}": _entry(b"{}") for n in ("spec.json", "campaign.json")}
    manifest = json.dumps({"members": {f"{PREFIX}/bomb.bin": _entry(bytes(8)),
                                       **listed}}).encode()
    with tarfile.open(path, "w:gz", compresslevel=1, copybufsize=1 << 22) as tar:
        entries = [("MANIFEST.json", manifest, None), ("bomb.bin", None, size)]
        for name, data, length in entries if manifest_first else entries[::-1]:
            info = tarfile.TarInfo(f"{PREFIX}/{name}")
            info.size = len(data) if data is not None else length
            tar.addfile(info, io.BytesIO(data) if data is not None else _Zeros(length))
    return path


@pytest.mark.parametrize(
    ("manifest_first", "code", "words"),
    [(True, 1, "holds 1,073,741,824 bytes, the manifest says 8: refused unread"),
     (False, 2, "its first member is c-archive/bomb.bin, not MANIFEST.json")],
)
def test_an_inflating_bomb_is_refused_with_bounded_memory(
    tmp_path: Path, manifest_first: bool, code: int, words: str
) -> None:
    path = _bomb(tmp_path / "bomb.tar.gz", 1 << 30, manifest_first)
    assert path.stat().st_size < 8 << 20
    exit_code, said, peak_mib = _verify_in_a_process(path)
    assert exit_code == code and words in said, said
    baseline = _verify_in_a_process(_archive(tmp_path / "small.tar.gz", GOOD))[2]
    # Bounded: the same peak as for a 100-byte archive (the interpreter and its imports).
    assert peak_mib < baseline + 64, f"peak RSS {peak_mib:.0f} MiB, baseline {baseline:.0f} MiB"


def _verify_in_a_process(path: Path) -> tuple[int, str, float]:
    """Exit code, stderr and peak RSS (MiB) of a real `campaign verify-archive` process."""
    process = subprocess.Popen(
        [sys.executable, "-m", "campaign", "verify-archive", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    _, status, usage = os.wait4(process.pid, 0)
    said = process.stderr.read() if process.stderr else ""
    return os.waitstatus_to_exitcode(status), said, usage.ru_maxrss / 1024


def _long_header(path: Path, size: int, kind: bytes) -> Path:
    """A header block claiming a ``size``-byte pax header (``x``) or GNU long name (``L``),
    followed by a few MB of zeros: tarfile would read the claimed size whole."""
    import gzip

    header = bytearray(tarfile.TarInfo(f"{PREFIX}/././@LongLink").tobuf())[:512]
    header[124:136] = f"{size:011o}\0".encode()
    header[156:157] = kind
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    with gzip.open(path, "wb", compresslevel=1) as out:
        _archive(path.with_suffix(".good"), GOOD)
        with tarfile.open(path.with_suffix(".good"), "r:gz") as good:
            first = good.next()
            assert first is not None
            out.write(first.tobuf())
            extracted = good.extractfile(first)
            assert extracted is not None
            data = extracted.read()
            out.write(data + bytes(-len(data) % 512))
        out.write(bytes(header))
        for _ in range(8):
            out.write(bytes(1 << 20))
    return path


@pytest.mark.parametrize("kind", [b"x", b"L"])
def test_a_huge_extended_header_is_refused_unread(tmp_path: Path, kind: bytes) -> None:
    path = _long_header(tmp_path / "long.tar.gz", 1 << 40, kind)
    code, said = _verify(path)
    assert code == 1 and "refused unread" in said, said
    assert ("pax extended header" if kind == b"x" else "GNU long name") in said


def test_an_archive_whose_manifest_lists_nothing_does_not_verify(tmp_path: Path) -> None:
    code, said = _verify(_archive(tmp_path / "empty.tar.gz", [], {"members": {}}))
    assert code == 1 and "MANIFEST.json lists no member" in said


def test_a_spec_changed_with_its_member_hash_is_refused(tmp_path: Path) -> None:
    """The attacker rewrites spec.json and its hash in the manifest: the spec's own hash,
    the one the ledger froze, no longer matches."""
    changed = [(f"{PREFIX}/spec.json", b'{"a": 2}'), *GOOD[1:]]
    code, said = _verify(_archive(tmp_path / "spec.tar.gz", changed))
    assert code == 1 and "spec.json hashes to" in said and "the spec was changed" in said


def test_a_sparse_member_is_refused_unread(tmp_path: Path) -> None:
    """A GNU sparse member's holes read as zeros without input: 400 bytes could claim a
    petabyte for the check to hash. Refused from its header."""
    path = tmp_path / "sparse.tar.gz"
    manifest = json.dumps({"spec_sha256": SPEC_SHA256, "members": {
        n: _entry(d) for n, d in GOOD}}).encode()
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [(f"{PREFIX}/MANIFEST.json", manifest), *GOOD[:1]]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        holes = tarfile.TarInfo(f"{PREFIX}/holes.bin")
        holes.type = tarfile.GNUTYPE_SPARSE
        tar.addfile(holes)
    code, said = _verify(path)
    assert code == 1 and "sparse" in said and "refused unread" in said, said
