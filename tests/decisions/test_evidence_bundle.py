"""Evidence bundles: built offline or from the reviewer's page, verified anywhere without us.

The shipped verifier (`service/decisions/bundle_verifier.py`, `verify.py` in a bundle) runs
here as a reviewer runs it: the system's python3 with `-I`, in a clean directory,
with a minimal environment and only openssl beside it. Its RFC 8785 serialiser is
checked byte for byte against the `rfc8785` package the service hashes with.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import plyvel
import pytest
import requests
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import example, given
from hypothesis import strategies as st

from service.auth.tokens import mint_token
from service.cli import main
from service.decisions import bundle_verifier as verifier
from service.decisions.evidence_bundle import BundleSelection
from service.decisions.shipped_verifier import shipped_verifier
from store.backends.leveldb import LevelDBLaneStore
from store.canonical import canonical_json
from store.chain.checkpoints import KEY_FILE, CheckpointSigner
from store.chain.entry import seal
from store.chain.evidence import EvidenceChain
from store.chain.head import GENESIS, format_timestamp
from store.chain.keys import chain_name, entry_key
from store.secrets import SecretsHome, local_secret
from tests.http.test_http_decisions import auditor, exercise, listed
from tests.support.live import JWT_SECRET, LiveService
from tests.support.served import Served, start

SYSTEM_PYTHON = "/usr/bin/python3"  # not the venv: no sessionstate, no rfc8785
MINIMAL_ENV = {"PATH": "/usr/bin:/bin"}
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
UI = "/ui/decisions"
BUNDLE = "/ui/evidence-bundle"


# --- the verifier's canonical JSON is RFC 8785, byte for byte ------------------------------

SAFE_INTEGERS = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | SAFE_INTEGERS | FLOATS | st.text()
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=24,
)
EDGE_FLOATS = [1e-7, 1e-6, 1.5e-7, 0.00001, 1e16, 1.5e16, 1e20, 1e21, 1.2345678901234568e16]
EDGE_FLOATS += [5e-324, 1.7976931348623157e308, 0.1 + 0.2, 123.0, -0.0, 3.507, 2.0**53, 0.001]


@given(JSON_VALUES)
@example([*EDGE_FLOATS, *(-value for value in EDGE_FLOATS)])
@example({"\U0001f600": 1, "\ufb01": 2, "a": 3, "": 4, "\x7f\n\u2028": '\x00\x1f\\"'})
def test_the_verifier_writes_the_bytes_rfc8785_writes(value: Any) -> None:
    assert verifier.canonical(value) == rfc8785.dumps(value)


@given(JSON_VALUES)
@example(2.0**53)  # written as an integer beyond 2**53: the chain refuses to seal it
def test_stored_bytes_parse_and_reserialise_to_themselves(value: Any) -> None:
    stored = rfc8785.dumps(value)
    parsed = verifier.parse(stored, "value")
    try:
        again = rfc8785.dumps(parsed)
    except ValueError:  # it does not read back: `seal` refuses such a body
        with pytest.raises(ValueError):
            verifier.canonical(parsed)
        return
    assert again == stored
    assert verifier.canonical(parsed) == stored


def _entry_body(latency_ms: float, extra: Any, tenant: str) -> dict[str, Any]:
    return {
        "recorded_at": format_timestamp(T0),
        "decision": {"action": "read", "allow": True, "latency_ms": latency_ms},
        "target": {"tenant_id": tenant},
        "input": {"extra": extra},
    }


@given(FLOATS, JSON_VALUES, st.text())
@example(3.507, None, "acme")
@example(1e-7, 1e21, "acme")
@example(0.0, [1e16, 0.00001], "\U0001f600")
def test_every_sealed_entry_rehashes_in_the_verifier(
    latency_ms: float, extra: Any, tenant: str
) -> None:
    try:
        (sealed,), _ = seal([_entry_body(latency_ms, extra, tenant)], GENESIS)
    except ValueError:  # what the chain itself refuses to seal (a float beyond 2**53)
        return
    entry = verifier.parse(sealed.value, "entry")
    assert verifier.canonical(entry) == sealed.value
    assert verifier.entry_hash(entry) == sealed.entry["hash"]


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, 2**53, -(2**53), "\ud800", {"\udfff": 1}]
)
def test_what_has_no_canonical_form_is_refused_by_both(value: Any) -> None:
    with pytest.raises(ValueError):
        rfc8785.dumps(value)
    with pytest.raises(ValueError):
        verifier.canonical(value)


# --- running the shipped verifier as a reviewer would --------------------------------------


def unpack(archive: Path, into: Path) -> Path:
    """The bundle unpacked with the system's tar in an empty directory; its one folder."""
    into.mkdir()
    subprocess.run(["tar", "-xzf", str(archive)], cwd=into, env=MINIMAL_ENV, check=True)
    (folder,) = into.iterdir()
    return folder


def run_verifier(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SYSTEM_PYTHON, "-I", "verify.py", *args],
        cwd=folder,
        env=MINIMAL_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def lines_of(folder: Path) -> list[bytes]:
    return (folder / "entries.ndjson").read_bytes().splitlines()


def write_lines(folder: Path, lines: list[bytes]) -> None:
    (folder / "entries.ndjson").write_bytes(b"".join(line + b"\n" for line in lines))


def _edit(folder: Path) -> None:
    lines = lines_of(folder)
    lines[1] = lines[1].replace(b'"recorded_at":"2', b'"recorded_at":"1', 1)
    write_lines(folder, lines)


def _remove(folder: Path) -> None:
    lines = lines_of(folder)
    del lines[1]
    write_lines(folder, lines)


def _edit_and_rehash(folder: Path) -> None:
    lines = lines_of(folder)
    entry = json.loads(lines[1])
    entry["outcome"]["status"] = 599
    entry.pop("hash")
    entry["hash"] = "sha256:" + hashlib.sha256(rfc8785.dumps(entry)).hexdigest()
    lines[1] = rfc8785.dumps(entry)
    write_lines(folder, lines)


def _forge_manifest(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_bytes())
    del manifest["entries"][1]
    (folder / "manifest.json").write_bytes(rfc8785.dumps(manifest))
    _remove(folder)


def _crlf(folder: Path) -> None:
    (folder / "entries.ndjson").write_bytes(b"".join(line + b"\r\n" for line in lines_of(folder)))


def _edit_readme(folder: Path) -> None:
    readme = folder / "README.md"
    readme.write_text(readme.read_text().replace("What it does not prove", "Nothing else", 1))


def _move_checkpoint(folder: Path) -> None:
    checkpoint = json.loads((folder / "checkpoint.json").read_text())
    checkpoint["seq"] += 1
    (folder / "checkpoint.json").write_text(json.dumps(checkpoint))


@dataclass
class ServedBundle:
    archive: Path
    public_key: Path
    printed: dict[str, Any]


def _token(sub: str, tenant: str, role: str = "model-service") -> str:
    scope = {"workspace": "ws-1", "session": "chat-1"} if role == "model-service" else {}
    return mint_token(
        JWT_SECRET.encode(), sub=sub, roles=[role], tenant=tenant, ttl_seconds=600, **scope
    )


def _traffic(served: Served) -> None:
    """Decisions about two tenants, interleaved, so acme's entries have others between."""
    http = requests.Session()
    for n in range(6):
        for tenant in ("acme", "globex"):
            path = f"/v1/tenants/{tenant}/workspaces/ws-1/sessions/chat-{n}/state"
            token = _token(f"svc-{tenant}", tenant)
            assert http.get(served.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code in (403, 404)  # fmt: skip
    intruder = {"Authorization": f"Bearer {_token('svc-globex', 'globex')}"}
    denied = http.get(served.url + "/v1/tenants/acme/workspaces/ws-1/sessions/chat-1/state", headers=intruder, timeout=10)  # fmt: skip
    assert denied.status_code == 403
    reader = {"Authorization": f"Bearer {_token('au-acme', 'acme', role='auditor')}"}
    assert http.get(served.url + "/v1/decisions", headers=reader, timeout=10).status_code == 200


@pytest.fixture(scope="module")
def served_bundle(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> ServedBundle:
    """acme's bundle, made offline from the data dir of a `sessionstate serve` that ran."""
    tmp = tmp_path_factory.mktemp("served-bundle")
    served = start(opa_bin, tmp / "var", tmp)
    try:
        _traffic(served)
    finally:
        served.process.terminate()
        served.process.wait(30)
    archive, public_key = tmp / "acme.tar.gz", tmp / "pinned.pem"
    printed, pem = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SESSIONSTATE_DATA_DIR", str(served.data_dir))
        with contextlib.redirect_stdout(printed):
            assert main(["decisions", "bundle", "--out", str(archive), "--tenant", "acme"]) == 0
        with contextlib.redirect_stdout(pem):
            assert main(["decisions", "public-key"]) == 0
    public_key.write_text(pem.getvalue())
    return ServedBundle(archive, public_key, json.loads(printed.getvalue()))


def test_a_served_process_bundle_verifies_in_a_clean_directory(
    served_bundle: ServedBundle, tmp_path: Path
) -> None:
    folder = unpack(served_bundle.archive, tmp_path / "clean")
    assert sorted(path.name for path in folder.iterdir()) == [
        "README.md",
        "checkpoint.json",
        "checkpoint.note",
        "entries.ndjson",
        "log-key.vkey",
        "manifest.json",
        "manifest.sig",
        "proofs.ndjson",
        "public-key.pem",
        "verify.py",
    ]
    # Nothing of sessionstate can be imported where the verifier runs.
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", "import service, store"],
        cwd=folder,
        env=MINIMAL_ENV,
        capture_output=True,
        check=False,
    )
    assert probe.returncode != 0

    done = run_verifier(folder, "--public-key", str(served_bundle.public_key))
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("VERIFIED (README.md says what this proves and what it does not)\n")
    assert "(your pinned key)" in done.stdout
    entries = [json.loads(line) for line in lines_of(folder)]
    assert len(entries) == served_bundle.printed["entries"] >= 8
    assert {entry["target"]["tenant_id"] for entry in entries} == {"acme"}
    denial = [e for e in entries if e["actor"]["tenant_id"] == "globex"]
    assert [e["outcome"]["status"] for e in denial] == [403]  # another tenant's attempt on acme
    # acme's decisions are a chain of their own: every link between them is checked.
    seqs = [entry["seq"] for entry in entries]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert "0 gaps cross entries not in this bundle" in done.stdout
    assert f"proofs     {len(entries)} inclusion proofs" in done.stdout
    assert (
        served_bundle.printed["checkpoint"]["seq"]
        == json.loads((folder / "checkpoint.json").read_text())["seq"]
    )

    # Without a pinned key it still checks, and says whose key it used.
    unpinned = run_verifier(folder)
    assert unpinned.returncode == 0
    assert "shipped in the bundle: compare with the key you pinned" in unpinned.stdout


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (_edit, "its content does not hash to its hash (hash_mismatch)"),
        (_remove, "in the manifest, missing from entries.ndjson"),
        # The next entry of the (gapless) chain links to the old hash: that is seen first.
        (_edit_and_rehash, "does not link to seq 2 (prev_hash_mismatch)"),
        (_forge_manifest, "manifest.json: the signature does not verify"),
        (_move_checkpoint, "checkpoint.json: the signature does not verify"),
        (_crlf, "entries.ndjson line 1 ends with CR LF: not the bytes stored"),
        (_edit_readme, "README.md: its sha256 is not the one the signed manifest lists"),
    ],
    ids=[
        "edit-one",
        "remove-one",
        "edit-and-rehash",
        "forge-manifest",
        "move-checkpoint",
        "crlf-line-ends",
        "edit-readme",
    ],
)
def test_a_tampered_bundle_fails(
    served_bundle: ServedBundle, tmp_path: Path, tamper: Any, said: str
) -> None:
    folder = unpack(served_bundle.archive, tmp_path / "clean")
    tamper(folder)
    done = run_verifier(folder, "--public-key", str(served_bundle.public_key))
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("FAILED: ") and said in line
    assert "VERIFIED" not in done.stdout


def _verifier_obtained_separately(into: Path) -> Path:
    """`sessionstate decisions verifier > verify.py`, in a directory of its own."""
    into.mkdir()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("sessionstate")), "decisions", "verifier"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    (into / "verify.py").write_bytes(done.stdout)
    return into / "verify.py"


@pytest.mark.parametrize("entry_edited", [False, True], ids=["verifier-only", "and-an-entry"])
def test_a_replaced_verifier_is_caught_by_one_obtained_separately(
    served_bundle: ServedBundle, tmp_path: Path, entry_edited: bool
) -> None:
    folder = unpack(served_bundle.archive, tmp_path / "clean")
    if entry_edited:
        _edit(folder)
    (folder / "verify.py").write_text('print("VERIFIED")\n')
    fooled = run_verifier(folder, "--public-key", str(served_bundle.public_key))
    assert fooled.returncode == 0 and fooled.stdout == "VERIFIED\n"  # what a shipped one can do

    own = _verifier_obtained_separately(tmp_path / "mine")
    assert own.read_bytes() == shipped_verifier()  # byte for byte what bundles ship
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", str(own), "--public-key", str(served_bundle.public_key), str(folder)],
        cwd=tmp_path,
        env=MINIMAL_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    said = "hash_mismatch" if entry_edited else "verify.py: its sha256 is not the one the signed manifest lists"  # fmt: skip
    assert line.startswith("FAILED: ") and said in line
    assert "VERIFIED" not in done.stdout


def test_the_manifest_lists_the_sha256_of_every_other_file(
    served_bundle: ServedBundle, tmp_path: Path
) -> None:
    folder = unpack(served_bundle.archive, tmp_path / "clean")
    listed = json.loads((folder / "manifest.json").read_bytes())["sha256"]
    others = {path.name for path in folder.iterdir()} - {"manifest.json", "manifest.sig"}
    assert set(listed) == others == {"entries.ndjson", "checkpoint.json", "public-key.pem", "verify.py", "README.md", "checkpoint.note", "proofs.ndjson", "log-key.vkey"}  # fmt: skip
    sums = subprocess.run(
        ["sha256sum", *sorted(others)],
        cwd=folder,
        env=MINIMAL_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    assert sums.stdout == "".join(f"{listed[name]}  {name}\n" for name in sorted(others))
    # Run from elsewhere, the verifier takes the directory; it names files no signature covers.
    (folder / "notes.txt").write_text("not part of the bundle\n")
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", str(folder / "verify.py"), str(folder)],
        cwd=tmp_path,
        env=MINIMAL_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "files      8, each with the sha256 the signed manifest lists; not in the manifest, "
        "so covered by no signature: notes.txt\n"
    ) in done.stdout


def test_a_key_other_than_the_pinned_one_fails(served_bundle: ServedBundle, tmp_path: Path) -> None:
    folder = unpack(served_bundle.archive, tmp_path / "clean")
    other = tmp_path / "other.pem"
    other.write_bytes(CheckpointSigner(b"\x09" * 32).public_key_pem)
    done = run_verifier(folder, "--public-key", str(other))
    assert done.returncode == 1
    assert "checkpoint.json was signed by ed25519:" in done.stderr


def test_the_readme_commands_by_hand_pass(served_bundle: ServedBundle, tmp_path: Path) -> None:
    """The README's openssl and python3 lines, pasted in the bundle's directory."""
    folder = unpack(served_bundle.archive, tmp_path / "clean")
    readme = (folder / "README.md").read_text()
    by_hand = readme.split("The same checks by hand, in this directory:")[1]
    script = by_hand.split("```sh\n", 1)[1].split("```", 1)[0]
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=folder,
        env=MINIMAL_ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Signature Verified Successfully") == 2
    assert "entries hash correctly and are the signed list" in done.stdout
    assert done.stdout.count("  verify.py\n") == 1  # step 4 prints each file's listed sha256
    _edit(folder)
    again = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=MINIMAL_ENV, capture_output=True, check=False)  # fmt: skip
    assert again.returncode != 0


# --- the command line ----------------------------------------------------------------------


def _bodies(count: int) -> list[dict[str, Any]]:
    return [
        {
            "recorded_at": format_timestamp(T0 + timedelta(minutes=n)),
            "decision": {
                "action": "read" if n % 2 else "write",
                "allow": n % 3 != 0,
                "evaluated_at": format_timestamp(T0 + timedelta(minutes=n)),
                "latency_ms": 3.5 + n / 1000,
            },
            "target": {"tenant_id": "acme" if n % 4 else "globex"},
            "outcome": {"status": 200, "applied": False, "approval_id": None},
        }
        for n in range(count)
    ]


@pytest.fixture
def stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stopped service's data dir with 12 decisions: acme's chain of 9 (minutes 1-3, 5-7,
    9-11) and globex's of 3 (minutes 0, 4, 8); SESSIONSTATE_DATA_DIR names it."""
    data_dir = tmp_path / "var"
    lanes = LevelDBLaneStore(data_dir / "leveldb")
    bodies = _bodies(12)
    for tenant in ("acme", "globex"):
        EvidenceChain(lanes, tenant).append(
            [body for body in bodies if body["target"]["tenant_id"] == tenant]
        )
    lanes.close()
    monkeypatch.setenv("SESSIONSTATE_DATA_DIR", str(data_dir))
    return data_dir


def test_a_bundle_of_a_tenant_links_every_entry_of_its_chain(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "acme.tar.gz"
    assert main(["decisions", "bundle", "--out", str(archive), "--tenant", "acme"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["entries"] == 9 and printed["checkpoint"]["seq"] == 9
    assert printed["checkpoint"]["tenant_id"] == "acme"
    folder = unpack(archive, tmp_path / "clean")
    assert folder.name == "sessionstate-evidence-acme-9"
    done = run_verifier(folder)
    assert done.returncode == 0, done.stderr
    assert "links      8 between consecutive seqs checked by prev_hash; 0 gaps" in done.stdout
    assert "the last entry here is the signed head" in done.stdout
    assert "selection  tenant_id acme\n" in done.stdout


def test_a_bundle_made_before_the_manifest_listed_files_still_verifies_and_says_so(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "acme.tar.gz"
    assert main(["decisions", "bundle", "--out", str(archive), "--tenant", "acme"]) == 0
    capsys.readouterr()
    folder = unpack(archive, tmp_path / "clean")
    manifest = json.loads((folder / "manifest.json").read_bytes())
    del manifest["sha256"]
    manifest["kind"] = "sessionstate.evidence_bundle.v1"  # as releases before it signed them
    key = Ed25519PrivateKey.from_private_bytes(local_secret(stopped, KEY_FILE, nbytes=32))
    (folder / "manifest.json").write_bytes(rfc8785.dumps(manifest))
    (folder / "manifest.sig").write_bytes(key.sign(rfc8785.dumps(manifest)))
    done = run_verifier(folder)
    assert done.returncode == 0, done.stderr
    assert (
        "files      not listed in this (v1) manifest: no signature covers verify.py" in done.stdout
    )


def test_without_a_tenant_the_bundle_of_several_chains_is_refused(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "all.tar.gz"
    assert main(["decisions", "bundle", "--out", str(archive)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "name one with --tenant" in line
    assert not archive.exists()


def test_after_retention_the_bundle_starts_at_the_anchor(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = LevelDBLaneStore(stopped / "leveldb")
    assert (
        EvidenceChain(lanes, "acme").prune(
            T0 + timedelta(minutes=6), CheckpointSigner.of(SecretsHome.local(stopped)), T0
        )
        == 4
    )  # minutes 1-3, 5
    lanes.close()
    archive = tmp_path / "acme.tar.gz"
    assert main(["decisions", "bundle", "--out", str(archive), "--tenant", "acme"]) == 0
    capsys.readouterr()
    folder = unpack(archive, tmp_path / "clean")
    assert json.loads((folder / "manifest.json").read_bytes())["verified_from_seq"] == 5
    assert [json.loads(line)["seq"] for line in lines_of(folder)] == list(range(5, 10))
    done = run_verifier(folder)
    assert done.returncode == 0, done.stderr
    assert "| verified chain | seq 5 to 9:" in (folder / "README.md").read_text()


def test_since_and_until_select_by_evaluated_at(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "acme.tar.gz"
    since, until = "2026-01-05T09:03:00Z", "2026-01-05T10:07:00+01:00"  # minutes 3 to 6
    argv = ["--tenant", "acme", "--since", since, "--until", until]
    assert main(["decisions", "bundle", "--out", str(archive), *argv]) == 0
    capsys.readouterr()
    folder = unpack(archive, tmp_path / "clean")
    assert [json.loads(line)["seq"] for line in lines_of(folder)] == [
        3,
        4,
        5,
    ]  # minute 4 is globex's
    selection = json.loads((folder / "manifest.json").read_bytes())["selection"]
    assert selection == {
        "tenant_id": "acme",
        "action": None,
        "allow": None,
        "since": "2026-01-05T09:03:00.000000Z",
        "until": "2026-01-05T09:07:00.000000Z",
    }
    assert run_verifier(folder).returncode == 0


def test_the_bundle_is_refused_for_a_chain_that_does_not_verify(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = LevelDBLaneStore(stopped / "leveldb")
    entry = EvidenceChain(lanes, "acme").get(5)
    assert entry is not None
    lanes.put(entry_key(5, "acme"), canonical_json({**entry, "outcome": {"status": 201}}))
    lanes.close()
    out = tmp_path / "bundles"
    out.mkdir()
    argv = ["decisions", "bundle", "--out", str(out / "acme.tar.gz"), "--tenant", "acme"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "does not verify (hash_mismatch at seq 5): no evidence bundle is signed" in line
    assert list(out.iterdir()) == []  # no bundle, and no half-written one


def test_the_bundle_of_a_busy_store_says_busy(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = plyvel.DB(str(stopped / "leveldb"))
    try:
        assert main(["decisions", "bundle", "--out", str(tmp_path / "b.tar.gz")]) == 2
    finally:
        held.close()
    (line,) = capsys.readouterr().err.splitlines()
    assert "stop the service first, or review a copy of the data dir" in line
    assert not (tmp_path / "b.tar.gz").exists()


def test_the_bundle_of_a_corrupt_store_says_corrupt(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (stopped / "leveldb" / "CURRENT").write_bytes(b"")
    assert main(["decisions", "bundle", "--out", str(tmp_path / "b.tar.gz")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "is corrupt" in line and "sessionstate db repair" in line
    assert not (tmp_path / "b.tar.gz").exists()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--since", "2026-01-05T09:03:00"], "--since"),  # no time zone
        (["--until", "last-tuesday"], "--until"),
        (["--tenant", "acme/../x"], "--tenant"),
        (["--since", "2026-01-06T00:00:00Z", "--until", "2026-01-05T00:00:00Z"], "--until"),
    ],
)
def test_bad_bundle_options_are_named_not_echoed(
    stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    assert main(["decisions", "bundle", "--out", str(tmp_path / "b.tar.gz"), *argv]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"invalid {named}" in line
    for value in argv[1::2]:
        assert value not in line


def test_selection_matches_the_apis_time_rule() -> None:
    selection = BundleSelection(since=T0, until=T0 + timedelta(minutes=1))
    at = lambda moment: {"decision": {"evaluated_at": moment}}  # noqa: E731
    assert selection.matches(at("2026-01-05T09:00:00.000Z"))  # since is inclusive
    assert not selection.matches(at("2026-01-05T09:01:00.000Z"))  # until is exclusive
    assert not selection.matches(at("2026-01-05T08:59:59.999Z"))
    assert not selection.matches({"decision": {}})


# --- the reviewer's page -------------------------------------------------------------------


def sign_in(service: LiveService, token: str) -> requests.Session:
    browser = requests.Session()
    answer = browser.post(
        service.url + "/ui/login", data={"token": token}, allow_redirects=False, timeout=10
    )
    assert answer.status_code == 303
    return browser


def test_the_page_offers_the_bundle_of_its_filters(service: LiveService) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service))
    page = browser.get(service.url + UI, params={"action": "write", "limit": "5"}, timeout=10)
    assert f'href="{BUNDLE}?action=write" download' in page.text
    bad = browser.get(service.url + UI, params={"since": "yesterday"}, timeout=10)
    assert BUNDLE not in bad.text  # filters that do not apply offer no bundle


def test_the_download_is_a_logged_decision_and_verifies(
    service: LiveService, tmp_path: Path
) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service))
    answer = browser.get(service.url + BUNDLE, params={"action": "write"}, timeout=10)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "application/gzip"
    disposition = answer.headers["Content-Disposition"]
    assert disposition.startswith('attachment; filename="sessionstate-evidence-tenant-a-')
    archive = tmp_path / "download.tar.gz"
    archive.write_bytes(answer.content)
    folder = unpack(archive, tmp_path / "clean")
    assert run_verifier(folder).returncode == 0
    entries = [json.loads(line) for line in lines_of(folder)]
    assert [(e["decision"]["action"], e["target"]["tenant_id"]) for e in entries] == [
        ("write", "tenant-a")
    ]
    manifest = json.loads((folder / "manifest.json").read_bytes())
    assert manifest["selection"]["action"] == "write"
    assert manifest["selection"]["tenant_id"] == "tenant-a"

    logged = {e["decision"]["decision_id"]: e for e in listed(service, action="decisions.read")}
    download = logged[answer.headers["Sessionstate-Decision-Id"]]
    assert download["actor"]["sub"] == "au-1"
    assert download["outcome"]["status"] == 200


def test_no_bundle_for_a_broken_chain(service: LiveService) -> None:
    exercise(service)
    victim = listed(service)[2]
    edited = dict(victim, outcome={"status": 200, "applied": True})
    chain = chain_name(victim["target"]["tenant_id"])
    service.context.lanes.put(entry_key(victim["seq"], chain), canonical_json(edited))
    browser = sign_in(service, auditor(service))
    answer = browser.get(service.url + BUNDLE, timeout=10)
    assert answer.status_code == 409
    assert answer.headers["Content-Type"].startswith("text/html")
    assert "chain_unverified" in answer.text
    assert "Content-Disposition" not in answer.headers
    assert BUNDLE not in browser.get(service.url + UI, timeout=10).text


def test_the_bundle_needs_a_signed_in_auditor(service: LiveService) -> None:
    anonymous = requests.get(service.url + BUNDLE, allow_redirects=False, timeout=10)
    assert anonymous.status_code == 200 and 'name="token"' in anonymous.text
    operator = sign_in(service, service.operator()).get(service.url + BUNDLE, timeout=10)
    assert operator.status_code == 403 and "role_not_permitted" in operator.text
    browser = sign_in(service, auditor(service))
    bad = browser.get(
        service.url + BUNDLE, params={"since": "yesterday"}, allow_redirects=False, timeout=10
    )
    assert bad.status_code == 303
    assert bad.headers["Location"] == f"{UI}?since=yesterday"


# --- in a real browser ---------------------------------------------------------------------


@pytest.fixture
def chromium() -> str:
    from tests.http.test_ui import CHROMIUM

    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    return CHROMIUM


def test_the_button_downloads_a_bundle_that_verifies_in_chromium(
    service: LiveService, chromium: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.http.test_ui import CHROMIUM_ARGS, SCREENSHOTS

    exercise(service)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                java_script_enabled=False,
                accept_downloads=True,
                viewport={"width": 1280, "height": 900},
            )
            page = context.new_page()
            page.goto(service.url + UI)
            page.fill("#token", auditor(service))
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"**{UI}")
            page.select_option("select[name=allow]", "true")
            page.get_by_role("button", name="Apply").click()
            page.wait_for_url(f"**{UI}?*allow=true*")
            button = page.get_by_role("link", name="Download evidence bundle")
            expect(button).to_be_visible()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "ui-evidence-bundle.png"))
            with page.expect_download() as started:
                button.click()
            download = started.value
            assert download.suggested_filename.startswith("sessionstate-evidence-tenant-a-")
            archive = tmp_path / download.suggested_filename
            download.save_as(archive)
        finally:
            browser.close()
    folder = unpack(archive, tmp_path / "clean")
    done = run_verifier(folder)
    assert done.returncode == 0, done.stderr
    assert "selection  allow True, tenant_id tenant-a" in done.stdout
    with tarfile.open(archive) as bundle:
        assert all(member.uid == 0 and member.uname == "" for member in bundle.getmembers())
