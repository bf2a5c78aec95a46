"""Reviewer reads and the approval lookup, at two sizes each: do they grow with the data?

Builds a decision log directly through the store API (one tenant's chain of N
entries, plus N/10 spread over three other tenants' chains), then opens the
real service on it (`ServiceContext`, its OPA sidecar over policies/, the Flask
app through its test client: the same routes, policy calls and journal commits
a served request runs) and times, as an auditor of the big chain:

- verify: `GET /v1/decisions/verify` (a first, untimed call walks what no
  verify walked yet; the figure is the calls after it);
- the first list page and a deep one (`GET /v1/decisions?limit=100`, then with
  a cursor after 90% of the chain, as a reader following cursors holds);
- an export page (`GET /v1/decisions/export?limit=100` with that cursor);
- a reviewer's page view (`GET /ui/decisions`, signed in by its cookie).

Then, for two approval counts, builds a workspace's approvals (4 in 10 expired,
3 in 10 revoked, 3 in 10 other sessions' in force, and exactly one that
applies), written as a grant and a revocation write them (`approval_writes`:
expired ones keep their index keys, as before a prune), and times the lookup
a write does (`ApprovalStore.covering`).

Before the timing the store settles (`Store.settle`: LevelDB's compaction after
the bulk load, PostgreSQL's statistics). Each figure is the median of `--repeat`
calls (of the lookup, 200 times as many); the last column is the ratio of the
largest size to the smallest (the target is within 1.2x). Building uses
unsynced batches; entries are sealed with the standard library's JSON encoder,
checked byte for byte against the chain's own `seal` on a sample, and the whole
chain is verified afterwards by the first verify (its time is printed too).

`--postgres CONNINFO` measures the same on PostgreSQL (a database per
measurement is created on that server and dropped after).

Run: `make bench` or `.venv/bin/python bench/scale_bench.py [--sizes 10000 1000000]
[--approvals 10 100000] [--repeat 5] [--postgres CONNINFO]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.app import create_app
from service.approvals.index import mark_index_complete_if_empty
from service.approvals.lookup import ApprovalStore
from service.approvals.model import Approval
from service.approvals.writes import approval_writes, revocation
from service.auth.tokens import mint_token
from service.config.settings import Settings
from service.context import ServiceContext
from service.decisions.log import decision_id_key, seq_name
from service.decisions.query import encode_cursor
from service.policy.sidecar import OpaSidecar
from store.backends import postgres_schema
from store.backends.contract import Lanes
from store.backends.leveldb import LevelDBLaneStore
from store.backends.postgres import PostgresLaneStore
from store.chain.entry import seal
from store.chain.head import GENESIS, ChainHead, format_timestamp
from store.chain.keys import entry_key, marker_key
from store.scope import TenantScope
from tests.support.policy_inputs import allowed_input

ROOT = Path(__file__).resolve().parent.parent
JWT_SECRET = "jwt-secret-for-scale-bench-0123456789abcdef"
DIGEST_KEY = "digest-key-for-scale-bench-0123456789abcdef"
TENANT = "tenant-a"
OTHER_TENANTS = ("tenant-b", "tenant-c", "tenant-d")
PAGE = 100
BATCH = 5000
SAMPLE_EVERY = 997  # entries checked byte for byte against `seal`
_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class BenchFailure(RuntimeError):
    """An answer was not what it must be; the run stops."""


# -- building ---------------------------------------------------------------------------


def _templates() -> list[dict[str, Any]]:
    """Entry bodies as the routes make them, one per kind of decision a log holds most."""
    kinds = [
        ("read", "model-service", True, 200),
        ("read", "model-service", True, 200),
        ("write", "model-service", True, 200),
        ("write", "model-service", False, 403),
        ("preview", "model-service", True, 200),
        ("replay", "model-service", True, 200),
        ("decisions.read", "auditor", True, 200),
    ]
    bodies = []
    for action, role, allow, status in kinds:
        policy_input = allowed_input(action).model_dump(mode="json", by_alias=True)
        actor = policy_input["actor"]
        bodies.append(
            {
                "decision": {
                    "action": action,
                    "policy": "sessionstate/" + ("audit" if role == "auditor" else action),
                    "allow": allow,
                    "reasons": [] if allow else ["session_state_operator_approval_missing"],
                    "policy_revision": "sha256:" + "3e" * 32,
                    "engine": {"name": "opa", "version": "1.22.3"},
                },
                "actor": {
                    "sub": actor["sub"],
                    "roles": actor["roles"],
                    "tenant_id": actor.get("tenant_id"),
                    "workspace_id": actor.get("workspace_id"),
                    "session_id": actor.get("session_id"),
                },
                "outcome": {"status": status, "applied": action == "write" and allow},
                "input": policy_input,
            }
        )
    return bodies


def _bodies(tenant: str, count: int, start: datetime) -> Iterator[dict[str, Any]]:
    templates = _templates()
    for index in range(count):
        template = templates[index % len(templates)]
        moment = start + timedelta(milliseconds=10 * index)
        stamp = format_timestamp(moment)
        input_ = {
            **template["input"],
            "target": {**template["input"]["target"], "tenant_id": tenant},
        }
        yield {
            "decision": {
                **template["decision"],
                "decision_id": str(uuid.UUID(bytes=os.urandom(16), version=4)),
                "input_digest": "sha256:" + hashlib.sha256(stamp.encode()).hexdigest(),
                "evaluated_at": stamp[:23] + "Z",
                "latency_ms": round(0.2 + (index % 977) / 131, 3),
            },
            "actor": template["actor"],
            "target": {**input_["target"]},
            "outcome": {**template["outcome"], "approval_id": None},
            "input": input_,
            "recorded_at": stamp,
        }


def _sealed(body: dict[str, Any], head: ChainHead) -> tuple[bytes, ChainHead]:
    """What `seal` stores, made with the standard encoder (byte-equal for these bodies)."""
    entry = {**body, "seq": head.seq + 1, "prev_hash": head.hash}
    digest = "sha256:" + hashlib.sha256(_ENCODER.encode(entry).encode()).hexdigest()
    entry["hash"] = digest
    return _ENCODER.encode(entry).encode(), ChainHead(seq=head.seq + 1, hash=digest)


def build_chain(lanes: Lanes, tenant: str, count: int, start: datetime) -> None:
    """`count` entries on tenant's chain, with their id index keys, in unsynced batches."""
    head = GENESIS
    bodies = _bodies(tenant, count, start)
    while head.seq < count:
        with lanes.batch(sync=False) as batch:
            if head.seq == 0:
                batch.put(marker_key(tenant), b"")
            for body in (next(bodies) for _ in range(min(BATCH, count - head.seq))):
                before = head
                value, head = _sealed(body, before)
                if head.seq % SAMPLE_EVERY == 1:
                    [sealed], _ = seal([body], before, tenant)
                    if sealed.value != value:
                        raise BenchFailure("the fast sealing differs from the chain's own")
                batch.put(entry_key(head.seq, tenant), value)
                batch.put(
                    decision_id_key(tenant, body["decision"]["decision_id"]), seq_name(head.seq)
                )


class Store:
    """Where a measurement keeps its lanes: LevelDB in its data dir, or, with `--postgres`, a
    PostgreSQL database of its own made on that server (dropped at the end)."""

    def __init__(self, data_dir: Path, server: str | None) -> None:
        self.data_dir = data_dir
        self.server = server
        self.conninfo: str | None = None
        if server is not None:
            name = f"scale_bench_{os.getpid()}_{data_dir.name.replace('-', '_')}"
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            self.conninfo = make_conninfo(server, dbname=name)
            postgres_schema.upgrade(self.conninfo)

    def open(self) -> Lanes:
        if self.conninfo is not None:
            return PostgresLaneStore(self.conninfo)
        return LevelDBLaneStore(self.data_dir / "leveldb")

    def settle(self, lanes: Lanes, timeout: float = 60.0) -> None:
        """Let the store reach the state it keeps in service after a bulk load: on LevelDB,
        no level-0 tables waiting for compaction (seconds after an open); on PostgreSQL,
        fresh planner statistics (ANALYZE, as autovacuum runs after a load; with the
        statistics of an empty table the planner sorts a whole chain for a page)."""
        if self.conninfo is not None:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE")
            return
        database = getattr(lanes, "_db", None)  # LevelDB's own handle
        deadline = time.monotonic() + timeout
        while database is not None and time.monotonic() < deadline:
            # LevelDB compacts level 0 once it holds 4 tables (kL0_CompactionTrigger): fewer
            # are not waiting for a compaction, and a small store never gets one.
            if int(database.get_property(b"leveldb.num-files-at-level0") or b"0") < 4:
                return
            time.sleep(0.2)

    def drop(self) -> None:
        if self.server is not None and self.conninfo is not None:
            name = conninfo_to_dict(self.conninfo)["dbname"]
            with psycopg.connect(self.server, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(str(name))))


def build_log(store: Store, size: int) -> float:
    """The big chain and the others' in store; seconds it took."""
    started = time.perf_counter()
    lanes = store.open()
    try:
        start = datetime.now(UTC) - timedelta(milliseconds=10 * size + 60_000)
        build_chain(lanes, TENANT, size, start)
        for tenant in OTHER_TENANTS:
            build_chain(lanes, tenant, max(1, size // 30), start)
    finally:
        lanes.close()
    return time.perf_counter() - started


# -- timing -----------------------------------------------------------------------------


def median_ms(operation: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        operation()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


@contextmanager
def opened_service(store: Store, sidecar: OpaSidecar) -> Iterator[ServiceContext]:
    settings = Settings(
        data_dir=store.data_dir,
        store=store.conninfo,
        durable_writes=True,
        jwt_secret=JWT_SECRET,
        digest_key=DIGEST_KEY,
        rate_limit="off",
        denial_rate_limit="off",
    )
    context = ServiceContext.open(settings, opa_url=sidecar.url, opa_token=sidecar.token)
    try:
        yield context
    finally:
        context.close()


def reviewer_reads(context: ServiceContext, size: int, repeat: int) -> dict[str, float]:
    """Milliseconds per reviewer read of the big chain, as an auditor of its tenant."""
    client = create_app(context).test_client()
    token = mint_token(
        JWT_SECRET.encode(), sub="bench-auditor", roles=["auditor"], tenant=TENANT, ttl_seconds=3600
    )
    bearer = {"Authorization": f"Bearer {token}"}
    client.set_cookie("sessionstate_ui", token, path="/ui")  # as the sign-in form leaves it
    deep_after = min(size * 9 // 10, size - PAGE)
    deep = encode_cursor(deep_after, size)

    def get(path: str, headers: dict[str, str]) -> Any:
        answer = client.get(path, headers=headers)
        if answer.status_code != 200:
            raise BenchFailure(f"{path.split('?')[0]} answered {answer.status_code}")
        return answer

    def verify() -> None:
        if not get("/v1/decisions/verify", bearer).get_json()["ok"]:
            raise BenchFailure("the built chain does not verify")

    def page(cursor: str | None, first: int) -> Callable[[], None]:
        path = f"/v1/decisions?limit={PAGE}" + ("" if cursor is None else f"&cursor={cursor}")

        def read() -> None:
            seqs = [entry["seq"] for entry in get(path, bearer).get_json()["decisions"]]
            if seqs != list(range(first, first + PAGE)):
                raise BenchFailure("a list page did not hold the entries after its cursor")

        return read

    def export() -> None:
        lines = get(f"/v1/decisions/export?limit={PAGE}&cursor={deep}", bearer).data.splitlines()
        if json.loads(lines[0])["sessionstate"]["seq"] != deep_after + 1:
            raise BenchFailure("the export did not start after its cursor")

    def view() -> None:
        if b"Chain verified" not in get("/ui/decisions", {}).data:
            raise BenchFailure("the reviewer's page does not say the chain verified")

    figures = {}
    started = time.perf_counter()
    verify()  # the first walk, from wherever no verify reached yet
    figures["first verify (untimed)"] = (time.perf_counter() - started) * 1000
    figures["verify"] = median_ms(verify, repeat)
    figures["list, first page"] = median_ms(page(None, 1), repeat)
    figures["list, deep page"] = median_ms(page(deep, deep_after + 1), repeat)
    figures["export page"] = median_ms(export, repeat)
    figures["/ui/decisions view"] = median_ms(view, repeat)
    return figures


# -- approvals --------------------------------------------------------------------------


def build_approvals(lanes: Lanes, count: int, now: datetime) -> Approval:
    """count approvals in one workspace, stored as a grant (and a revocation) stores them; the
    one that applies to chat-1 is returned. Expired ones keep their index keys (not pruned)."""
    mark_index_complete_if_empty(lanes)  # a new store, as the service marks it
    applies = _approval(0, "chat-1", now - timedelta(minutes=5), now + timedelta(hours=1))
    approvals = [applies]
    for index in range(1, count):
        kind = index % 10
        if kind < 4:  # expired
            issued = now - timedelta(days=2, seconds=index)
            approvals.append(_approval(index, "chat-1", issued, issued + timedelta(hours=1)))
        elif kind < 7:  # revoked while in force
            issued = now - timedelta(minutes=10)
            approval = _approval(index, "chat-1", issued, now + timedelta(hours=2))
            approvals.append(revocation(approval, now) or approval)
        else:  # other sessions', in force
            issued = now - timedelta(minutes=10)
            approvals.append(_approval(index, f"chat-{index}", issued, now + timedelta(hours=3)))
    for offset in range(0, len(approvals), BATCH):
        with lanes.batch(sync=False) as batch:
            for approval in approvals[offset : offset + BATCH]:
                for key, change in approval_writes(approval):
                    if change is None:
                        batch.delete(key)
                    else:
                        batch.put(key, change)
    return applies


def _approval(index: int, session: str, issued: datetime, expires: datetime) -> Approval:
    return Approval(
        approval_id=f"appr_{index:024x}",
        tenant_id=TENANT,
        workspace_id="ws-1",
        session_id=session,
        operator="op-1",
        reason="scale bench",
        issued_at=issued.replace(microsecond=0),
        expires_at=expires.replace(microsecond=0),
    )


def approval_lookup(store: Store, count: int, repeat: int) -> float:
    """Milliseconds of the lookup a write makes, among count approvals of its workspace.

    The store is closed after building and opened again, as the service opens it, and the
    timing waits for it to settle (`Store.settle`): built in one go, the 30% revocations
    leave their deleted index keys in LevelDB's memory table and then in a level-0 table
    until it is compacted, a state a service passes through for a moment only (each grant
    and revocation also appends its decision entry, so LevelDB writes that table out every
    few thousand of them and compacts it soon after)."""
    now = datetime.now(UTC)
    lanes = store.open()
    try:
        applies = build_approvals(lanes, count, now)
    finally:
        lanes.close()
    lanes = store.open()
    try:
        store.settle(lanes)
        approvals = ApprovalStore(lanes)
        scope = TenantScope(tenant_id=TENANT, workspace_id="ws-1", session_id="chat-1")

        def lookup() -> None:
            found = approvals.covering(scope, now)
            if found is None or found.approval_id != applies.approval_id:
                raise BenchFailure("the lookup did not find the one approval that applies")

        lookup()
        return median_ms(lookup, repeat * 200)  # tens of microseconds each: many samples
    finally:
        lanes.close()


# -- report -----------------------------------------------------------------------------


def table(title: str, sizes: list[int], rows: dict[str, list[float]]) -> None:
    print(title)
    print(f"{'figure (ms)':<26}" + "".join(f"{size:>14,}" for size in sizes) + f"{'ratio':>11}")
    for name, values in rows.items():
        ratio = values[-1] / values[0] if values[0] else float("nan")
        ratio_text = "" if "untimed" in name else f"{ratio:>10.2f}x"
        print(f"{name:<26}" + "".join(f"{value:>14.3f}" for value in values) + ratio_text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[10_000, 1_000_000], help="entries of the chain"
    )
    parser.add_argument(
        "--approvals", type=int, nargs="+", default=[10, 100_000], help="approvals in the workspace"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per figure")
    parser.add_argument(
        "--postgres",
        metavar="CONNINFO",
        help="measure on PostgreSQL: a server where the bench may create (and drop) a "
        "database per measurement; default: LevelDB",
    )
    args = parser.parse_args()
    if min(args.sizes) < 2 * PAGE or min(args.approvals) < 1:
        sys.exit("sizes must be at least 200 entries, and approvals at least 1")
    opa = Settings().resolved_opa_bin()
    reads: dict[str, list[float]] = {}
    builds = []
    lookups = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp_name:
        tmp = Path(tmp_name)
        sidecar = OpaSidecar(opa, ROOT / "policies", tmp / "opa")
        sidecar.start()
        try:
            for size in args.sizes:
                store = Store(tmp / f"log-{size}", args.postgres)
                try:
                    builds.append(build_log(store, size))
                    with opened_service(store, sidecar) as context:
                        store.settle(context.lanes)
                        for name, value in reviewer_reads(context, size, args.repeat).items():
                            reads.setdefault(name, []).append(value)
                finally:
                    store.drop()
            for count in args.approvals:
                store = Store(tmp / f"approvals-{count}", args.postgres)
                try:
                    lookups.append(approval_lookup(store, count, args.repeat))
                finally:
                    store.drop()
        except BenchFailure as failure:
            sys.exit(f"scale bench aborted: {failure}")
        finally:
            sidecar.stop()
    kind = "LevelDB" if args.postgres is None else "PostgreSQL"
    print(
        f"{kind}; decision log: '{TENANT}' chain of N entries (+ N/10 on "
        f"{len(OTHER_TENANTS)} other tenants' chains); built in "
        + ", ".join(f"{s:.0f} s" for s in builds)
        + f"; median of {args.repeat} calls; {os.cpu_count()} CPUs"
    )
    table("reviewer reads, N entries", args.sizes, reads)
    print()
    table("approval lookup of a write, N approvals in the workspace", args.approvals, {
        "covering approval": lookups
    })  # fmt: skip


if __name__ == "__main__":
    main()
