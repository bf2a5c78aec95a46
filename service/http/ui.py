"""The compliance reviewer's pages: the decision log in a browser, rendered on the server.

Browsers send no bearer header, so a reviewer pastes an auditor token once and
the page keeps it in a cookie only `/ui` sees (HttpOnly, SameSite=Strict, gone
when the token expires). Every page view authenticates from that cookie and is
decided and logged like the API's `decisions.read`: the same audit policy, the
same decision log. The pages run no script and load nothing from elsewhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args
from urllib.parse import urlencode, urlsplit

import jwt
from flask import Blueprint, Response, g, render_template, request, url_for
from pydantic import ValidationError

from service.api.reasons import Reason
from service.api.v1 import DECISION_ID
from service.auth.tokens import Actor, AuthenticationFailed
from service.decisions import revisions
from service.decisions.journal import JournalClosed
from service.decisions.log import DecisionLogEntry
from service.decisions.query import MAX_LIMIT, DecisionQuery
from service.http.common import context, journal_decision, pending_decision
from service.http.decisions import audit_decision, chain_status, decision_entry
from service.http.problems import Problem, problem_of
from service.http.ui_bundle import bundle_download
from service.http.ui_chart import decision_chart
from service.http.ui_log_head import log_head
from service.policy.errors import PolicyRefusal
from service.policy.input import PolicyAction
from service.rate_limits import RateLimited
from store.backends.contract import StoreOffline
from store.record.violations import violations_of

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="../templates")

COOKIE = "sessionstate_ui"
ACTIONS: tuple[str, ...] = get_args(PolicyAction)
PAGE_SIZE = 50
MAX_COOKIE_BYTES = 4000  # browsers drop cookies over ~4 KiB without a word
# `Cache-Control: no-store` is set app-wide, with every other answer that carries decisions.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
_PAGE_DETAILS = {  # what the API's problem details say, in a reviewer's words
    "validation_failed": "This token names no tenant, and the page shows the decision log "
    "of the token's own tenant only.",
    "role_not_permitted": "The audit policy lets only auditors read the decision log. "
    "Sign out and sign in with an auditor token.",
    "cross_tenant_scope_rejected": "The audit policy lets an auditor read the decisions "
    "of its own tenant only.",
    "cross_site_request_rejected": "Sign-in and sign-out are accepted from this page only.",
    "chain_unverified": "The decision log does not verify, so no evidence bundle is signed "
    "for it. The chain status on the decision log page names the first problem.",
}
_FILTER_HINTS = {
    "action": "one of the listed actions",
    "allow": "any, allowed or denied",
    "since": "a date and time (UTC)",
    "until": "a date and time (UTC), after since",
    "shadow": "any, agrees or disagrees",
    "limit": f"a whole number from 1 to {MAX_LIMIT}",
    "cursor": "only the next-page link of this page",
}


# --- sign-in -----------------------------------------------------------------------------


@bp.get("")
@bp.get("/")
def index() -> Response:
    return _see_other(url_for("ui.decisions"))


@bp.get("/login")
def login_form() -> Response:
    return _see_other(url_for("ui.decisions"))


@bp.post("/login")
def login() -> Response:
    """Verify a pasted token and keep it in the page's cookie until the token expires."""
    _same_site_only()
    token = request.form.get("token", "").strip()
    after = _safe_next(request.form.get("next"))
    try:
        actor = context().verifier.verify("Bearer " + token)
    except AuthenticationFailed as failure:
        g.problem_reason = failure.reason.value
        return _sign_in(after, error="That token was not accepted.", status=401)
    if len(COOKIE) + len(token) > MAX_COOKIE_BYTES:
        return _sign_in(after, error="That token is too long to keep in a browser.", status=401)
    g.actor_sub = actor.sub
    expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    response = _see_other(after)
    response.set_cookie(
        COOKIE,
        token,
        max_age=max(0, int(expires - time.time())),
        path=bp.url_prefix,
        secure=request.is_secure,
        httponly=True,
        samesite="Strict",
    )
    return response


@bp.post("/logout")
def logout() -> Response:
    _same_site_only()
    response = _see_other(url_for("ui.decisions"))
    _forget(response)
    return response


# --- pages -------------------------------------------------------------------------------


@bp.get("/decisions")
def decisions() -> Response:
    """The tenant's decisions: chain status, filters, a chart over time, one page of entries."""
    actor = _signed_in()
    if actor is None:
        return _sign_in_again()
    trace, tenant = audit_decision(actor)
    filters = Filters.from_args(request.args)
    query, problems = filters.query()
    page: list[DecisionLogEntry] = []
    next_url = bundle_url = None
    chart = None
    decision_log = context().decision_log
    if query is not None:
        bundle_url = _with_query(url_for("ui.evidence_bundle"), filters.selection())
        listed = decision_log.page(tenant, query)
        page = listed.entries
        if listed.next_cursor is not None:
            next_url = (
                url_for("ui.decisions") + "?" + urlencode(filters.with_cursor(listed.next_cursor))
            )
        everything = decision_log.entries(tenant, query.model_copy(update={"cursor": None}))
        chart = decision_chart((e.decision.evaluated_at, e.decision.allow) for e in everything)
    # From the head the last verify signed: a view does not walk the whole log again.
    verified, last_walk = chain_status(tenant)
    lanes = context().lanes
    body = render_template(
        "ui/decisions.html",
        actor=actor,
        tenant=tenant,
        trace=trace,
        chain=verified.result,
        resumed=verified.resumed_from,
        last_walk=last_walk,
        filters=filters,
        actions=ACTIONS,
        problems=problems,
        page=page,
        next_url=next_url,
        bundle_url=bundle_url,
        log_head=log_head(tenant),
        chart=chart,
        policy_revisions=revisions.revisions(lanes, tenant),
        revisions_complete=revisions.complete(lanes),
    )
    return Response(body, status=200 if query is not None else 422)


@bp.get("/evidence-bundle")
def evidence_bundle() -> Response:
    """The tenant's entries under the page's filters, with a signed checkpoint and a verifier.

    Decided and logged like a page view; a broken chain gets no bundle (409), as it
    gets no checkpoint. Filters that do not apply lead back to the page, which says why.
    """
    actor = _signed_in()
    if actor is None:
        return _sign_in_again()
    filters = Filters.from_args(request.args)
    query, _ = filters.query()
    if query is None:
        return _see_other(_with_query(url_for("ui.decisions"), filters.selection()))
    trace, tenant = audit_decision(actor)
    return bundle_download(trace, tenant, query)


@bp.get("/decisions/<decision_id>")
def decision(decision_id: str) -> Response:
    """One entry of the auditor's own tenant, as `GET /v1/decisions/<id>` is."""
    actor = _signed_in()
    if actor is None:
        return _sign_in_again()
    trace, found = decision_entry(actor, decision_id)
    entry = found.entry
    body = render_template(
        "ui/entry.html",
        actor=actor,
        tenant=entry.target.tenant_id,
        trace=trace,
        entry=entry,
        hash_ok=found.hash_ok,
        policy_input=json.dumps(entry.input, indent=2, sort_keys=True),
        as_stored=json.dumps(entry.model_dump(mode="json"), indent=2),
    )
    return Response(body)


@bp.context_processor
def _page_helpers() -> dict[str, Any]:
    return {"when": _when, "stamp": _stamp, "max_limit": MAX_LIMIT}


# --- errors and headers ------------------------------------------------------------------


@bp.errorhandler(Problem)
@bp.errorhandler(PolicyRefusal)
@bp.errorhandler(RateLimited)
def _problem_page(error: Exception) -> Response:
    problem = problem_of(error)
    g.problem_reason = problem.reason
    if problem.reason in _PAGE_DETAILS:
        detail = _PAGE_DETAILS[problem.reason]
    elif problem.kind is Reason.POLICY_DENIED:
        detail = "The audit policy did not allow this page."
    else:
        detail = problem.detail()
    body = render_template("ui/error.html", problem=problem, detail=detail, actor=_signed_in())
    return Response(body, status=problem.status, headers=problem.headers)


@bp.after_request
def _keep_decision(response: Response) -> Response:
    """Log the page view's decision here, so a log that cannot keep it fails as a page."""
    if pending_decision() is None:
        return response
    try:
        journal_decision(response.status_code)
    except (JournalClosed, StoreOffline) as error:
        return _problem_page(error)
    return response


@bp.after_app_request
def _security_headers(response: Response) -> Response:
    # App-wide, so that /ui paths no route matches (404, 405) carry them too.
    if request.path == bp.url_prefix or request.path.startswith(f"{bp.url_prefix}/"):
        response.headers.update(SECURITY_HEADERS)
    return response


# --- helpers -----------------------------------------------------------------------------


def _see_other(location: str) -> Response:
    return Response(status=303, headers={"Location": location})


def _with_query(path: str, params: Mapping[str, str]) -> str:
    return f"{path}?{urlencode(params)}" if params else path


def _signed_in() -> Actor | None:
    """The actor of the page's cookie; None without a valid one."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    try:
        actor = context().verifier.verify("Bearer " + token)
    except AuthenticationFailed:
        return None
    g.actor_sub = actor.sub
    return actor


def _sign_in_again() -> Response:
    """The sign-in page, dropping a cookie that no longer authenticates."""
    stale = COOKIE in request.cookies
    response = _sign_in(
        _safe_next(request.path),
        notice="Your sign-in has expired or is no longer valid." if stale else None,
    )
    if stale:
        _forget(response)
    return response


def _sign_in(
    after: str, *, error: str | None = None, notice: str | None = None, status: int = 200
) -> Response:
    body = render_template("ui/sign_in.html", next=after, error=error, notice=notice)
    headers = {"WWW-Authenticate": 'Bearer realm="sessionstate"'} if status == 401 else {}
    return Response(body, status=status, headers=headers)


def _forget(response: Response) -> None:
    response.delete_cookie(
        COOKIE, path=bp.url_prefix, secure=request.is_secure, httponly=True, samesite="Strict"
    )


def _same_site_only() -> None:
    """Refuse a sign-in or sign-out posted from another site (login CSRF).

    Browsers say where a request comes from in Sec-Fetch-Site; older ones only in
    Origin, which is "null" under this page's no-referrer policy, and refused then.
    """
    fetch_site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if fetch_site is not None:
        cross_site = fetch_site not in ("same-origin", "none")
    else:
        cross_site = origin is not None and urlsplit(origin).netloc != request.host
    if cross_site:
        raise Problem(Reason.CROSS_SITE_REQUEST_REJECTED)


def _safe_next(path: str | None) -> str:
    """Where to go after signing in: this page's own paths only, never another site."""
    prefix = f"{bp.url_prefix}/decisions"
    if path is not None and path.startswith(prefix + "/"):
        decision_id = path.removeprefix(prefix + "/")
        if DECISION_ID.fullmatch(decision_id):
            return url_for("ui.decision", decision_id=decision_id)
    return url_for("ui.decisions")


@dataclass(frozen=True)
class Filters:
    """The filter form as sent, kept as text so the form shows back what was typed."""

    action: str = ""
    allow: str = ""
    since: str = ""
    until: str = ""
    shadow: str = ""
    limit: str = str(PAGE_SIZE)
    cursor: str = ""

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> Filters:
        names = ("action", "allow", "since", "until", "shadow", "limit", "cursor")
        return cls(**{name: args[name] for name in names if name in args})

    def query(self) -> tuple[DecisionQuery | None, list[str]]:
        """The API's query for these filters, or None and what to fix (field hints, no values)."""
        values: dict[str, Any] = {
            name: text
            for name in ("action", "allow", "shadow", "limit", "cursor")
            if (text := getattr(self, name))
        }
        values.setdefault("limit", PAGE_SIZE)
        broken: list[str] = []
        for name in ("since", "until"):
            if text := getattr(self, name):
                moment = _utc(text)
                values[name] = moment
                if moment is None:
                    broken.append(name)
        if broken:
            return None, [f"{name}: {_FILTER_HINTS[name]}" for name in broken]
        try:
            query = DecisionQuery.model_validate(values)
        except ValidationError as error:
            names = dict.fromkeys(str(v.loc[0]) for v in violations_of(error, DecisionQuery))
            return None, [f"{name}: {_FILTER_HINTS.get(name, 'invalid')}" for name in names]
        if query.since is not None and query.until is not None and query.since >= query.until:
            return None, [f"until: {_FILTER_HINTS['until']}"]
        return query, []

    def selection(self) -> dict[str, str]:
        """The filters that select entries (not the page size or position), as sent."""
        kept = {
            name: getattr(self, name) for name in ("action", "allow", "since", "until", "shadow")
        }
        return {name: value for name, value in kept.items() if value}

    def with_cursor(self, cursor: str) -> dict[str, str]:
        """Query parameters of the next page: these filters, that cursor."""
        return {**self.selection(), "limit": self.limit, "cursor": cursor}


def _when(evaluated_at: str) -> str:
    """An RFC 3339 UTC time as the table shows it: date, time to the millisecond."""
    try:
        return _stamp(datetime.fromisoformat(evaluated_at))
    except ValueError:
        return evaluated_at


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _utc(text: str) -> datetime | None:
    """A `datetime-local` value (no zone: taken as UTC), or an ISO 8601 time with one."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
