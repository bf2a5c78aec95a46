"""The compliance reviewer's page: sign in with an auditor token, review the tenant's log.

HTTP-level tests against the live service, then one run in headless Chromium
(Debian's, driven by Playwright) that keeps screenshots in build/screenshots/.
"""

from __future__ import annotations

import html
import re
import shutil
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from service.auth.tokens import mint_token
from service.http.ui_chart import CHART_BUCKETS, decision_chart
from service.policy.sidecar import OpaSidecar, send_signal
from store.canonical import canonical_json
from store.chain.keys import chain_name, entry_key
from tests.http.test_http_decisions import auditor, exercise, listed
from tests.support.live import JWT_SECRET, LiveService
from tests.support.paths import ROOT
from tests.support.processes import pause

UI = "/ui/decisions"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "build" / "screenshots"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def sign_in(service: LiveService, token: str) -> requests.Session:
    """A browser-like client holding the page's cookie."""
    browser = requests.Session()
    answer = browser.post(
        service.url + "/ui/login", data={"token": token}, allow_redirects=False, timeout=10
    )
    assert answer.status_code == 303, answer.text
    return browser


def view(browser: requests.Session, service: LiveService, path: str = UI, **params: Any) -> Any:
    return browser.get(service.url + path, params=params, allow_redirects=False, timeout=10)


def listed_ids(page_html: str) -> list[str]:
    """Decision ids of the table's rows, in order."""
    return re.findall(r'href="/ui/decisions/([^"?]+)"', page_html)


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [entry["decision"]["decision_id"] for entry in entries]


def local_input(rfc3339: str) -> str:
    """A time as an `<input type=datetime-local>` sends it (UTC on this page)."""
    return datetime.fromisoformat(rfc3339).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


# --- signing in ----------------------------------------------------------------------------


def test_without_a_cookie_the_page_asks_for_a_token(service: LiveService) -> None:
    answer = view(requests.Session(), service)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/html")
    assert 'action="/ui/login"' in answer.text
    assert 'name="token"' in answer.text
    assert "<script" not in answer.text


def test_a_bad_token_is_refused_without_echoing_it(service: LiveService) -> None:
    forged = mint_token(b"another-secret-0123456789abcdef-xyz", sub="au-1", roles=["auditor"], tenant="tenant-a", ttl_seconds=600)  # fmt: skip
    for token in (forged, "not-a-token", ""):
        answer = requests.post(
            service.url + "/ui/login", data={"token": token}, allow_redirects=False, timeout=10
        )
        assert answer.status_code == 401
        assert "That token was not accepted." in answer.text
        assert "Set-Cookie" not in answer.headers
        if token:
            assert token not in answer.text


def test_sign_in_keeps_the_token_in_a_strict_cookie_for_the_page_only(
    service: LiveService,
) -> None:
    answer = requests.post(
        service.url + "/ui/login",
        data={"token": auditor(service)},
        allow_redirects=False,
        timeout=10,
    )
    assert answer.status_code == 303
    assert answer.headers["Location"] == UI
    cookie = answer.headers["Set-Cookie"]
    attributes = {part.strip().split("=")[0].lower(): part for part in cookie.split(";")}
    assert cookie.startswith("sessionstate_ui=")
    assert "httponly" in attributes
    assert attributes["samesite"].strip() == "SameSite=Strict"
    assert attributes["path"].strip() == "Path=/ui"
    assert "secure" not in attributes  # plain http here; set when the request is https
    assert 590 <= int(attributes["max-age"].split("=")[1]) <= 600  # the token's ttl


def test_a_drill_down_link_survives_signing_in(service: LiveService) -> None:
    exercise(service)
    wanted = ids(listed(service))[0]
    sign_in_page = view(requests.Session(), service, f"{UI}/{wanted}")
    assert f'name="next" value="{UI}/{wanted}"' in sign_in_page.text
    answer = requests.post(
        service.url + "/ui/login",
        data={"token": auditor(service), "next": "https://evil.example/"},
        allow_redirects=False,
        timeout=10,
    )
    assert answer.headers["Location"] == UI  # never off the page


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "null", "Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ],
)
def test_sign_in_from_another_site_is_refused(
    service: LiveService, headers: dict[str, str]
) -> None:
    answer = requests.post(
        service.url + "/ui/login",
        data={"token": auditor(service)},
        headers=headers,
        allow_redirects=False,
        timeout=10,
    )
    assert answer.status_code == 403
    assert "cross_site_request_rejected" in answer.text
    assert "Set-Cookie" not in answer.headers


def test_sign_out_and_an_expired_cookie_lead_back_to_sign_in(service: LiveService) -> None:
    browser = sign_in(service, auditor(service))
    out = browser.post(service.url + "/ui/logout", allow_redirects=False, timeout=10)
    assert out.status_code == 303
    assert "sessionstate_ui=;" in out.headers["Set-Cookie"]
    assert 'name="token"' in view(browser, service).text

    expired = mint_token(JWT_SECRET.encode(), sub="au-1", roles=["auditor"], tenant="tenant-a", ttl_seconds=60, now=int(time.time()) - 120)  # fmt: skip
    browser.cookies.set("sessionstate_ui", expired, path="/ui")
    answer = view(browser, service)
    assert answer.status_code == 200
    assert "expired or is no longer valid" in answer.text
    assert "sessionstate_ui=;" in answer.headers["Set-Cookie"]


# --- the log -------------------------------------------------------------------------------


def test_the_page_lists_the_tenants_decisions_and_no_others(service: LiveService) -> None:
    exercise(service)
    other = service.token(tenant="tenant-b")
    assert (
        service.call("GET", service.session_path("tenant-b") + "/state", other).status_code == 404
    )
    theirs = ids(listed(service, auditor(service, "tenant-b")))
    assert theirs
    answer = view(sign_in(service, auditor(service)), service, limit=1000)
    assert answer.status_code == 200
    # Everything of tenant-a up to the page view, which is logged once it is rendered.
    ours = listed(service)
    assert listed_ids(answer.text) == ids(ours)[:-1]
    assert not any(decision_id in answer.text for decision_id in theirs)
    assert "Chain verified" in answer.text
    (denied,) = [e for e in ours if not e["decision"]["allow"]]
    row = answer.text[answer.text.index(ids([denied])[0]) :]
    row = row[: row.index("</tr>")]
    assert '<span class="badge denied">denied</span>' in row
    assert all(reason in row for reason in denied["decision"]["reasons"])
    assert f'<td class="num">{denied["outcome"]["status"]}</td>' in row


def test_filters_match_the_api(service: LiveService) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service))
    denied = view(browser, service, action="read", allow="false")
    assert listed_ids(denied.text) == ids(listed(service, action="read", allow="false"))
    assert len(listed_ids(denied.text)) == 1
    writes = view(browser, service, action="write")
    assert listed_ids(writes.text) == ids(listed(service, action="write"))
    first = listed(service)[0]["decision"]["evaluated_at"]
    none = view(browser, service, until=local_input(first))
    assert listed_ids(none.text) == []
    assert "No decisions match these filters." in none.text
    since = view(browser, service, since=local_input(first), action="preview")
    assert listed_ids(since.text) == ids(listed(service, action="preview"))


def test_pages_follow_the_cursor(service: LiveService) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service))
    first = view(browser, service, limit=4)
    link = re.search(r'href="(/ui/decisions\?[^"]+)"', first.text)
    assert link is not None
    second = view(browser, service, html.unescape(link.group(1)))
    everything = ids(listed(service))
    assert listed_ids(first.text) + listed_ids(second.text)[:2] == everything[:6]


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "many"},
        {"action": "delete"},
        {"allow": "yes"},
        {"since": "yesterday"},
        {"cursor": "bm9wZQ"},
        {"since": "2026-01-02T00:00", "until": "2026-01-01T00:00"},
    ],
)
def test_bad_filters_show_a_message(service: LiveService, query: dict[str, str]) -> None:
    answer = view(sign_in(service, auditor(service)), service, **query)
    assert answer.status_code == 422
    assert "The filters were not applied" in answer.text
    assert 'aria-label="Decisions"' not in answer.text  # no entries (the live policy is shown)
    for name in set(query) & {"since", "until", "limit"}:  # shown back as typed, escaped
        assert f'name="{name}" step="1" value="{query[name]}"' in answer.text or (
            f'name="limit" min="1" max="1000" value="{query[name]}"' in answer.text
        )


def test_the_chart_counts_allowed_and_denied_over_time(service: LiveService) -> None:
    exercise(service)
    answer = view(sign_in(service, auditor(service)), service)
    svg = answer.text[answer.text.index("<svg") : answer.text.index("</svg>")]
    assert '<title id="chart-title">Allowed and denied decisions over time</title>' in svg
    assert "Allowed (5)" in svg
    assert "Denied (1)" in svg
    assert svg.count("<title>") == CHART_BUCKETS[0]  # one per bar


def test_the_chart_buckets_between_the_first_and_last_decision() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def entry(minutes: int, allow: bool) -> tuple[str, bool]:
        moment = start + timedelta(minutes=minutes)
        return moment.isoformat(), allow

    chart = decision_chart([entry(0, True), entry(0, False), entry(60, True), entry(120, True)])
    assert chart is not None
    assert (chart.allowed, chart.denied) == (3, 1)
    assert len(chart.bars) == CHART_BUCKETS[0]
    assert chart.bars[0].title == "00:00:00 to 00:10:00 UTC: 1 allowed, 1 denied"
    assert chart.bars[6].title == "01:00:00 to 01:10:00 UTC: 1 allowed, 0 denied"
    assert chart.bars[-1].title.endswith("1 allowed, 0 denied")
    assert sum(bar.allowed_height > 0 for bar in chart.bars) == 3
    assert [tick.label for tick in chart.y_ticks] == ["0", "1", "2"]
    assert [tick.label for tick in chart.x_ticks] == [
        "00:00:00",
        "00:30:00",
        "01:00:00",
        "01:30:00",
        "02:00:00",
    ]
    many = decision_chart([entry(n, n % 5 != 0) for n in range(1000)])
    assert many is not None
    assert len(many.bars) == CHART_BUCKETS[1]
    assert [tick.label for tick in many.y_ticks] == ["0", "20", "40", "60"]
    assert decision_chart([]) is None


def test_a_broken_chain_is_shown_at_the_top(service: LiveService) -> None:
    exercise(service)
    victim = listed(service)[3]
    edited = dict(victim, outcome={"status": 200, "applied": True})
    service.context.lanes.put(
        entry_key(victim["seq"], chain_name(victim["target"]["tenant_id"])),
        canonical_json(edited),
    )
    answer = view(sign_in(service, auditor(service)), service)
    assert f"Chain broken at seq {victim['seq']}" in answer.text
    assert "hash_mismatch" in answer.text
    assert "Chain verified" not in answer.text


# --- one entry -----------------------------------------------------------------------------


def test_one_entry_in_full(service: LiveService) -> None:
    exercise(service)
    write = listed(service, action="write")[0]
    answer = view(sign_in(service, auditor(service)), service, f"{UI}/{ids([write])[0]}")
    assert answer.status_code == 200
    for value in (write["hash"], write["prev_hash"], write["decision"]["policy_revision"]):
        assert value in answer.text
    assert write["recorded_at"] in answer.text
    policy_input = html.unescape(answer.text)
    assert f'"state_digest": "{write["input"]["record"]["state_digest"]}"' in policy_input
    assert 'href="/ui/decisions"' in answer.text


def test_an_unknown_entry_and_another_tenants_are_both_404(service: LiveService) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service, "tenant-b"))
    missing = view(browser, service, f"{UI}/no-such-decision")
    assert missing.status_code == 404
    assert "decision_not_found" in missing.text
    theirs = view(browser, service, f"{UI}/{ids(listed(service))[0]}")
    assert theirs.status_code == 404
    assert "decision_not_found" in theirs.text
    assert "cross_tenant_scope_rejected" not in theirs.text
    assert listed(service)[0]["hash"] not in theirs.text


# --- who may look, and what is kept of it --------------------------------------------------


def test_an_operator_token_gets_a_403_page(service: LiveService) -> None:
    answer = view(sign_in(service, service.operator()), service)
    assert answer.status_code == 403
    assert answer.headers["Content-Type"].startswith("text/html")
    assert "role_not_permitted" in answer.text
    assert "<table" not in answer.text


def test_a_token_without_a_tenant_is_told_so(service: LiveService) -> None:
    tenantless = service.token("auditor", sub="au-1", tenant=None, workspace=None, session=None)
    answer = view(sign_in(service, tenantless), service)
    assert answer.status_code == 422
    assert "names no tenant" in answer.text
    assert "<table" not in answer.text


def test_every_ui_response_carries_the_security_headers(service: LiveService) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service))
    wanted = ids(listed(service))[0]
    responses = [
        view(requests.Session(), service),
        requests.post(service.url + "/ui/login", data={"token": "x"}, timeout=10),
        view(browser, service),
        view(browser, service, limit="0"),
        view(browser, service, f"{UI}/{wanted}"),
        view(browser, service, f"{UI}/no-such-decision"),
        view(sign_in(service, service.operator()), service),
        view(browser, service, "/ui/no-such-page"),
    ]
    for answer in responses:
        for name, value in SECURITY_HEADERS.items():
            assert answer.headers.get(name) == value, (answer.url, name)


def test_page_views_are_logged_decisions(service: LiveService) -> None:
    browser = sign_in(service, auditor(service))
    page = view(browser, service)
    denied = view(sign_in(service, service.operator()), service)
    assert denied.status_code == 403
    logged = listed(service, action="decisions.read")
    shown = re.search(
        r"This page view is a decision too \(<span class=\"mono\">([^<]+)<", page.text
    )
    assert shown is not None
    by_id = {entry["decision"]["decision_id"]: entry for entry in logged}
    assert by_id[shown.group(1)]["actor"]["sub"] == "au-1"
    assert by_id[shown.group(1)]["outcome"] == {
        "status": 200,
        "applied": False,
        "approval_id": None,
    }
    refused = [e for e in logged if e["actor"]["sub"] == "op-1"]
    assert [(e["decision"]["allow"], e["outcome"]["status"]) for e in refused] == [(False, 403)]


def test_an_unavailable_policy_engine_shows_no_log(
    fragile: tuple[LiveService, OpaSidecar],
) -> None:
    service, sidecar = fragile
    exercise(service)
    browser = sign_in(service, auditor(service))
    pause(sidecar.pid)
    try:
        answer = view(browser, service)
    finally:
        send_signal(sidecar, signal.SIGCONT)
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "1"
    assert "policy_engine_unavailable" in answer.text
    assert "<table" not in answer.text
    assert view(browser, service).status_code == 200


def test_a_view_the_log_cannot_keep_is_not_shown(service: LiveService) -> None:
    exercise(service)
    browser = sign_in(service, auditor(service))
    service.context.journal.close()
    answer = view(browser, service)
    assert answer.status_code == 503
    assert answer.headers["Content-Type"].startswith("text/html")
    assert "decision_log_unavailable" in answer.text
    assert "<table" not in answer.text
    assert answer.headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]


# --- in a real browser ---------------------------------------------------------------------


@pytest.fixture
def chromium() -> str:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    return CHROMIUM


def test_a_reviewer_signs_in_and_drills_down_in_chromium(
    service: LiveService, chromium: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    exercise(service)
    for n in range(12):  # a little more traffic, so the chart has something to show
        session = f"chat-{n % 3 + 1}"
        token = service.token(session=session, tenant="tenant-b" if n % 4 == 3 else "tenant-a")
        service.call("GET", service.session_path(s=session) + "/state", token)
    entries = listed(service)  # and this listing's own decisions.read, logged after it answered
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        try:
            # No JavaScript: the page must work without any.
            context = browser.new_context(
                java_script_enabled=False, viewport={"width": 1280, "height": 900}
            )
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda message: errors.append(message.text))
            page.goto(service.url + UI)
            expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
            page.fill("#token", auditor(service))
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"**{UI}")

            rows = page.locator("section[aria-label='Decisions'] tbody tr")
            expect(rows).to_have_count(len(entries) + 1)
            expect(rows.first).to_contain_text(entries[0]["decision"]["action"])
            expect(page.locator("svg.chart")).to_be_visible()
            expect(page.locator("svg.chart rect[fill='#c53030']").first).to_be_visible()
            expect(page.get_by_text("Chain verified")).to_be_visible()
            expect(page.get_by_text("Which policy decided when")).to_be_visible()
            page.screenshot(path=str(SCREENSHOTS / "ui-decisions.png"), full_page=True)

            rows.first.get_by_role("link").click()
            expect(page.locator("#entry-hash")).to_have_text(entries[0]["hash"])
            expect(page.get_by_role("heading", name="Policy input")).to_be_visible()
            page.screenshot(path=str(SCREENSHOTS / "ui-decision-entry.png"), full_page=True)
            assert errors == []  # e.g. nothing the CSP had to block
        finally:
            browser.close()


@pytest.mark.parametrize("width", [1280, 1400])
def test_the_table_stays_inside_its_card_at_common_widths(
    service: LiveService, chromium: str, width: int
) -> None:
    """Long subjects, ids and reasons wrap; no column spills out of the card."""
    from playwright.sync_api import sync_playwright

    long_ids = {"workspace": "w" * 60, "session": "s" * 60}
    for n in range(4):
        token = service.token(sub=f"{n}-" + "x" * 126, tenant="tenant-a", **long_ids)
        service.call(
            "GET", service.session_path(w=long_ids["workspace"], s="s" * 60) + "/state", token
        )
    service.call("GET", service.session_path() + "/state", service.token(tenant="tenant-b"))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                java_script_enabled=False, viewport={"width": width, "height": 900}
            )
            context.add_cookies(
                [{"name": "sessionstate_ui", "value": auditor(service), "url": service.url}]
            )
            page = context.new_page()
            page.goto(service.url + UI)
            card = page.locator("section[aria-label=Decisions]").bounding_box()
            assert card is not None
            for cell in page.locator("thead th, tbody td").all():
                box = cell.bounding_box()
                assert box is not None
                assert box["x"] + box["width"] <= card["x"] + card["width"] + 0.5
            page.screenshot(path=str(SCREENSHOTS / f"ui-decisions-{width}.png"), full_page=True)
        finally:
            browser.close()
