"""A full disk loses nothing: the served process on a real, small ext4 file system.

The data dir lives on a loop-mounted ext4 image. A balloon file leaves little
room, writers write until the store refuses (503 `store_unavailable`), the
balloon goes, the service reopens the store by itself, writers write again,
and after a restart every acknowledged write and its decision are there and
the chain verifies. The room left varies from round to round, so the disk
fills during a log append in some rounds and during a memtable compaction in
others (LevelDB's LOG tells which; the test prints it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from service.auth.tokens import mint_token
from tests.support.factories import state_input
from tests.support.live import JWT_SECRET
from tests.support.served import Served, start

IMAGE_MIB = 40
TENANT, WORKSPACE = "tenant-a", "ws-1"
WRITERS = 4


def _token(role: str, session: str | None = None) -> str:
    scope: dict[str, str] = {"tenant": TENANT}
    if role == "model-service":
        scope |= {"workspace": WORKSPACE, "session": session or "s"}
    return mint_token(JWT_SECRET.encode(), sub="disk", roles=[role], ttl_seconds=3600, **scope)


def _path(session: str) -> str:
    return f"/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/sessions/{session}/state"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh ext4 file system of IMAGE_MIB, mounted through a loop device."""
    if os.geteuid() != 0:
        pytest.skip(
            "LOUD SKIP: the full-disk test mounts an ext4 image and needs root (CI is root)"
        )
    image, mount = tmp_path / "disk.img", tmp_path / "mnt"
    mount.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(IMAGE_MIB * 1024 * 1024)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True)
    mounted = (
        made.returncode == 0
        and (
            subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True)
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip(
            "LOUD SKIP: cannot mount a loop device here (mkfs.ext4 or mount -o loop failed)"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@dataclass
class Ledger:
    """What the service acknowledged: the newest digest per session, and every decision id."""

    digests: dict[str, str] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _approve(url: str) -> None:
    requests.post(
        f"{url}/v1/tenants/{TENANT}/workspaces/{WORKSPACE}/approvals",
        json={"ttl_seconds": 86400, "reason": "full-disk test"},
        headers={"Authorization": f"Bearer {_token('operator')}"},
        timeout=10,
    ).raise_for_status()


def _writer(url: str, session: str, ledger: Ledger, stop: threading.Event, turn: int) -> None:
    http = requests.Session()
    headers = {"Authorization": f"Bearer {_token('model-service', session)}"}
    filler = "x" * 1500  # raw text: digested, never stored
    while not stop.is_set():
        turn += 1
        body = state_input(turns=[{"turn_id": f"t{turn}", "role": "user", "payload": filler}])
        with ledger.lock:
            known = ledger.digests.get(session)
        sent = dict(headers, **({"If-Match": f'"{known}"'} if known else {}))
        try:
            answer = http.put(url + _path(session), json=body, headers=sent, timeout=10)
        except requests.RequestException:
            continue
        with ledger.lock:
            if answer.status_code in (200, 201):
                ledger.digests[session] = answer.json()["record"]["state_digest"]
                ledger.decisions.append(answer.json()["decision"]["decision_id"])
            else:
                reason = answer.json().get("reason", str(answer.status_code))
                ledger.refusals[reason] = ledger.refusals.get(reason, 0) + 1
            refused = ledger.refusals.get("store_unavailable", 0)
        if refused and answer.status_code == 503:
            time.sleep(0.05)


def _write_until(url: str, ledger: Ledger, done: threading.Event | None, seconds: float) -> None:
    """WRITERS threads write until `done` is set by the caller, or for `seconds`."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=_writer, args=(url, f"s{n}", ledger, stop, 10_000 * n))
        for n in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (done is not None and done.is_set()):
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(30)


def _readiness(url: str) -> tuple[int, dict[str, object]]:
    answer = requests.get(url + "/readyz", timeout=5)
    return answer.status_code, answer.json()


def _inflate(mount: Path, leave: int) -> Path:
    """A balloon file that leaves about `leave` bytes free on the file system."""
    balloon = mount / "balloon"
    free = shutil.disk_usage(mount).free
    with open(balloon, "ab") as handle:
        handle.truncate(0)
        os.posix_fallocate(handle.fileno(), 0, max(free - leave, 1))
    return balloon


@pytest.mark.slow
def test_a_full_disk_loses_no_acknowledged_write(
    small_fs: Path, opa_bin: str, tmp_path: Path
) -> None:
    data_dir = small_fs / "var"
    ledger = Ledger()
    stories: list[tuple[int, list[str]]] = []
    served = start(opa_bin, data_dir, tmp_path)
    _approve(served.url)
    try:
        # Room left: small (the next log append fails) to larger (a compaction fails).
        for leave in (96 * 1024, 3 * 1024 * 1024, 256 * 1024, 6 * 1024 * 1024, 32 * 1024):
            balloon = _inflate(small_fs, leave)
            full = threading.Event()
            watcher = threading.Thread(target=_watch_refusals, args=(ledger, full))
            watcher.start()
            _write_until(served.url, ledger, full, seconds=90)
            watcher.join()
            assert full.is_set(), (
                f"the disk never filled with {leave} bytes left: {ledger.refusals}"
            )
            stories.append((leave, _leveldb_story(data_dir / "leveldb")))
            status, readiness = _readiness(served.url)
            assert status == 503 and "store_unwritable" in readiness["reasons"]  # type: ignore[operator]
            metrics = requests.get(served.url + "/metrics", timeout=5).text
            assert "sessionstate_store_writable 0.0" in metrics
            balloon.unlink()
            _wait_ready(served.url)  # reopened by itself: no request, no operator
            before = len(ledger.decisions)
            _write_until(served.url, ledger, None, seconds=2)
            assert len(ledger.decisions) > before, "writes after the disk was freed"
        served = _restart(served, opa_bin, data_dir, tmp_path)
        _check_everything_acknowledged_is_there(served.url, ledger)
    finally:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(30)
    for leave, story in stories:
        print(f"room left {leave}: LevelDB says {story or 'nothing (a log append failed)'}")
    assert any(not story for _, story in stories), "no round filled the disk during a log append"
    assert any(story for _, story in stories), "no round filled the disk during a compaction"


def _watch_refusals(ledger: Ledger, full: threading.Event) -> None:
    """Full once the store has refused a few writes in a row."""
    start_count = ledger.refusals.get("store_unavailable", 0)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with ledger.lock:
            refused = ledger.refusals.get("store_unavailable", 0) - start_count
        if refused >= 8:
            full.set()
            return
        time.sleep(0.05)


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _ = _readiness(url)
        if status == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"not ready again after space came back: {_readiness(url)}")


def _restart(served: Served, opa_bin: str, data_dir: Path, tmp_path: Path) -> Served:
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(30) == 0, served.log.read_text()[-2000:]
    return start(opa_bin, data_dir, tmp_path)


def _check_everything_acknowledged_is_there(url: str, ledger: Ledger) -> None:
    for session, digest in ledger.digests.items():
        read = requests.get(
            url + _path(session),
            headers={"Authorization": f"Bearer {_token('model-service', session)}"},
            timeout=10,
        )
        assert read.status_code == 200, read.text
        assert read.json()["read_report"]["record"]["state_digest"] == digest
    auditor = {"Authorization": f"Bearer {_token('auditor')}"}
    http = requests.Session()
    for decision_id in ledger.decisions:
        found = http.get(f"{url}/v1/decisions/{decision_id}", headers=auditor, timeout=10)
        assert found.status_code == 200, decision_id
        assert found.json()["entry"]["outcome"]["applied"] is True
    verify = http.get(f"{url}/v1/decisions/verify", headers=auditor, timeout=60).json()
    assert verify["ok"] is True, verify


def _leveldb_story(database: Path) -> list[str]:
    """LevelDB's own words on what failed: a log append, a compaction, or both."""
    lines: list[str] = []
    log = database / "LOG"  # this open's: the previous one's is LOG.old
    if log.exists():
        lines += [
            line.split(" ", 2)[-1]
            for line in log.read_text(errors="replace").splitlines()
            if "error" in line.lower() or "dropping" in line.lower()
        ]
    return lines[-20:]
