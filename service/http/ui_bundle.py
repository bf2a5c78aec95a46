"""The reviewer page's evidence bundle download: the page's filters, the auditor's tenant.

The bundle is staged whole before the answer starts (in memory, then a temporary
file), so a page view whose decision cannot be kept still fails as a page.
"""

from __future__ import annotations

from tempfile import SpooledTemporaryFile

from flask import Response, request
from werkzeug.wsgi import wrap_file

from service.api.reasons import Reason
from service.api.v1 import DECISION_ID_HEADER
from service.decisions.evidence_bundle import BundleSelection, BundleTree, write_bundle
from service.decisions.query import DecisionQuery
from service.http.common import context
from service.http.problems import Problem
from service.policy.trace import DecisionTrace
from store.chain.signed_head import ChainUnverified

_SPOOL_BYTES = 16 << 20  # a bigger bundle is staged in a temporary file


def bundle_download(trace: DecisionTrace, tenant: str, query: DecisionQuery) -> Response:
    """The tenant's entries under the query's filters, as a `.tar.gz`; 409 for a broken chain."""
    selection = BundleSelection(
        tenant_id=tenant,
        action=query.action,
        allow=None if query.allow is None else query.allow == "true",
        since=query.since,
        until=query.until,
    )
    staged = SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 (the response closes it)
    try:
        made = write_bundle(
            staged,
            context().decision_log,
            context().secrets,
            selection,
            context().clock(),
            BundleTree(context().settings.log_origin, context().witnesses),
        )
    except ChainUnverified:
        staged.close()
        raise Problem(Reason.CHAIN_UNVERIFIED, decision=trace) from None
    staged.seek(0)
    return Response(
        wrap_file(request.environ, staged),
        mimetype="application/gzip",
        direct_passthrough=True,
        headers={
            "Content-Disposition": f'attachment; filename="{made.file_name}"',
            DECISION_ID_HEADER: trace.decision_id,
        },
    )
