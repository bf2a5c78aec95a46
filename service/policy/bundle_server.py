"""Serves the policy bundle to the local OPA sidecar, on loopback only.

OPA polls it; each poll re-reads the policy directory, so an edited policy is
picked up without a restart, and the bundle's revision (its content hash)
arrives in OPA together with the Rego it names.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from service.policy.bundle import load_bundle

BUNDLE_PATH = "/bundles/sessionstate.tar.gz"


class BundleServer:
    """A loopback HTTP server with one resource: the current policy bundle."""

    def __init__(self, policy_dir: Path) -> None:
        self.policy_dir = policy_dir
        handler = _handler_for(policy_dir)
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
        self._server.shutdown()
        self._server.server_close()


def _handler_for(policy_dir: Path) -> type[BaseHTTPRequestHandler]:
    class BundleHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != BUNDLE_PATH:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            bundle = load_bundle(policy_dir)
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
