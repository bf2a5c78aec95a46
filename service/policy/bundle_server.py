"""Serves the policy bundle to the local OPA sidecar, on loopback only.

OPA polls it every second; each poll gets the snapshot the service serves now
(`service.policy.source`), never the directory as it is being edited. The
bundle's revision (its content hash) arrives in OPA together with the Rego it
names, and is the ETag: a poll of an unchanged snapshot gets `304`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from service.policy.bundle import PolicyBundle

BUNDLE_PATH = "/bundles/sessionstate.tar.gz"


class BundleServer:
    """A loopback HTTP server with one resource: the policy bundle served now."""

    def __init__(self, current: Callable[[], PolicyBundle]) -> None:
        handler = _handler_for(current)
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


def _handler_for(current: Callable[[], PolicyBundle]) -> type[BaseHTTPRequestHandler]:
    class BundleHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != BUNDLE_PATH:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            bundle = current()
            etag = f'"{bundle.revision}"'
            if self.headers.get("If-None-Match") == etag:
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self.send_header("ETag", etag)
                self.end_headers()
                return
            body = bundle.tarball()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Polls every second are not worth a log line."""

    return BundleHandler
