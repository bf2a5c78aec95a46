"""Serves the policy bundle to the local OPA sidecar, on loopback only.

OPA polls it every second; each poll gets the snapshot the service serves now
(`service.policy.source`), never the directory as it is being edited. The
bundle's revision (its content hash) arrives in OPA together with the Rego it
names; the ETag is the revision, or for a signed bundle file the hash of its
bytes: a poll of an unchanged bundle gets `304`.

With a signed bundle (`service.policy.signed_bundle`), OPA's status plugin
also posts its reports on the bundle here (`POST /status`, with the per-start
token the sidecar gives OPA for this service), so the service learns whether
OPA activated or refused what it was offered.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from service.policy.bundle import ServedBundle
from service.policy.signed_bundle import OpaStatusBoard

BUNDLE_PATH = "/bundles/sessionstate.tar.gz"
STATUS_PATH = "/status"  # where OPA's status plugin posts, under the service's URL
MAX_STATUS_BYTES = 8 * 1024 * 1024  # OPA's report carries its Prometheus metrics too


class BundleServer:
    """A loopback HTTP server with one resource: the policy bundle served now."""

    def __init__(
        self,
        current: Callable[[], ServedBundle],
        *,
        board: OpaStatusBoard | None = None,
        token: str | None = None,
    ) -> None:
        handler = _handler_for(current, board, token)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="policy-bundle-server", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve loop that never ran
            self._server.shutdown()
        self._server.server_close()


def _handler_for(
    current: Callable[[], ServedBundle], board: OpaStatusBoard | None, token: str | None
) -> type[BaseHTTPRequestHandler]:
    class BundleHandler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if board is None or token is None or self.path != STATUS_PATH:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            sent = self.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                self.send_error(HTTPStatus.UNAUTHORIZED)
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_STATUS_BYTES:
                self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                return
            try:
                document = json.loads(self.rfile.read(length))
            except ValueError:
                self.send_error(HTTPStatus.BAD_REQUEST)
                return
            board.note_status(document)
            self.send_response(HTTPStatus.NO_CONTENT)
            self.end_headers()

        def do_GET(self) -> None:
            if self.path != BUNDLE_PATH:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            bundle = current()
            etag = f'"{bundle.etag}"'
            if self.headers.get("If-None-Match") == etag:
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self.send_header("ETag", etag)
                self.end_headers()
                return
            body = bundle.tarball()
            if board is not None:
                board.note_served()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Polls every second are not worth a log line."""

    return BundleHandler
