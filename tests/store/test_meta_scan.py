"""The idle-expiry sweep's walk of the meta lane, on LevelDB and PostgreSQL: bounded pages
across tenants and workspaces, resumed where the last stopped, tombstones skipped."""

from __future__ import annotations

from store.backends.contract import Lanes
from store.meta_scan import meta_page
from store.scope import TenantScope
from store.session_data import Erasure, erased_meta, meta_key, written_meta

WRITTEN_AT = "2026-06-01T12:00:00.000000Z"


def scope(tenant: str, workspace: str, session: str) -> TenantScope:
    return TenantScope(tenant_id=tenant, workspace_id=workspace, session_id=session)


def test_pages_walk_every_tenant_s_sessions_once_and_skip_tombstones(
    lanes_on_both: Lanes,
) -> None:
    written = [scope(t, w, s) for t in ("t-a", "t-b") for w in ("w-1", "w-2") for s in ("s1", "s2")]
    for each in written:
        lanes_on_both.put(meta_key(each), written_meta(WRITTEN_AT))
    erased = scope("t-a", "w-1", "s0")
    tombstone = Erasure(erased_at=WRITTEN_AT, erasure_decision_id="d-1", erasure_reason="expired")
    lanes_on_both.put(meta_key(erased), erased_meta(tombstone))

    seen: list[TenantScope] = []
    after = None
    pages = 0
    while True:
        found, after = meta_page(lanes_on_both, after, 3)
        pages += 1
        assert len(found) <= 3
        seen += [item.scope for item in found]
        assert all(item.updated_at == WRITTEN_AT for item in found)
        if after is None:
            break
    assert sorted(seen, key=str) == sorted(written, key=str)
    assert pages == 4  # nine meta keys, three a page, and a fourth, empty, finds the end
    again, _ = meta_page(lanes_on_both, None, 3)  # the next walk starts from the beginning
    assert [item.scope for item in again] == seen[:2]  # the tombstone was the first key
