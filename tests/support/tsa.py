"""A real RFC 3161 time-stamping authority for the tests: OpenSSL's own (`openssl ts -reply`)
behind a small HTTP front, nothing of it mocked.

`openssl_tsa(workdir)` makes a throwaway CA and a TSA certificate under it (P-256, the TSA's
with extendedKeyUsage critical timeStamping, as RFC 3161 2.3 requires) with `openssl req`
and `openssl x509`, writes a minimal `[ tsa ]` config, and serves
`POST /` on 127.0.0.1 from a thread: the posted `application/timestamp-query` is written
to a file, `openssl ts -reply -config ... -queryfile ... -inkey ... -signer ...` answers
it, and its DER goes back as `application/timestamp-reply`. `Tsa.mode` makes the front
answer garbage (`"garbage"`) or a 500 (`"error"`) instead; `Tsa.queries` counts what was
posted. The server is shut down and its thread joined at the end.

The reply carries the TSA's certificate only (the query asks for it, certReq), not the CA
(no `certs =` line): with one, OpenSSL writes the SignedData's certificate SET in chain
order rather than DER's sorted order, which rfc3161-client (strict DER) refuses to parse.
`openssl ts -verify -CAfile ca.pem` needs nothing more.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

Mode = Literal["ok", "garbage", "error"]
_CONFIG = """\
[ tsa ]
default_tsa = tsa_config

[ tsa_config ]
dir = {dir}
serial = $dir/tsaserial
crypto_device = builtin
signer_cert = $dir/tsa.pem
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = 1.3.6.1.4.1.4146.2.3
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""
_TSA_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = critical, timeStamping
"""


def _openssl(*args: str | Path) -> bytes:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, timeout=60)
    assert done.returncode == 0, f"openssl {args[0]} failed:\n{done.stderr[-2000:]!r}"
    return done.stdout


def make_authority(workdir: Path) -> tuple[Path, Path]:
    """ca.pem/ca.key, tsa.pem/tsa.key signed by it, tsa.cnf and its serial file; the CA's
    certificate and the TSA's."""
    workdir.mkdir(parents=True, exist_ok=True)
    p256 = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl(
        "req", "-x509", *p256, "-keyout", workdir / "ca.key", "-out", workdir / "ca.pem",
        "-subj", "/CN=sessionstate test TSA CA", "-days", "2",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    _openssl(
        "req", "-new", *p256, "-keyout", workdir / "tsa.key", "-out", workdir / "tsa.csr",
        "-subj", "/CN=sessionstate test TSA",
    )  # fmt: skip
    (workdir / "tsa.ext").write_text(_TSA_EXTENSIONS)
    _openssl(
        "x509", "-req", "-in", workdir / "tsa.csr", "-CA", workdir / "ca.pem",
        "-CAkey", workdir / "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", workdir / "tsa.ext", "-out", workdir / "tsa.pem",
    )  # fmt: skip
    (workdir / "tsaserial").write_text("01\n")
    (workdir / "tsa.cnf").write_text(_CONFIG.format(dir=workdir))
    return workdir / "ca.pem", workdir / "tsa.pem"


@dataclass
class Tsa:
    """The running TSA: its URL, the CA to verify its replies with, its certificate."""

    url: str
    ca: Path
    cert: Path
    mode: Mode = "ok"
    queries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(tsa: Tsa, workdir: Path) -> type[BaseHTTPRequestHandler]:
    class Front(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            query = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with tsa._lock:
                tsa.queries += 1
                if tsa.mode == "error":
                    self._answer(500, b"no", "text/plain")
                    return
                if tsa.mode == "garbage":
                    self._answer(200, b"\x30\x03garbage", "application/timestamp-reply")
                    return
                (workdir / "query.tsq").write_bytes(query)
                _openssl(
                    "ts", "-reply", "-config", workdir / "tsa.cnf",
                    "-queryfile", workdir / "query.tsq", "-inkey", workdir / "tsa.key",
                    "-signer", workdir / "tsa.pem", "-out", workdir / "reply.tsr",
                )  # fmt: skip
                self._answer(
                    200, (workdir / "reply.tsr").read_bytes(), "application/timestamp-reply"
                )

        def _answer(self, status: int, body: bytes, media_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", media_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: pytest shows failures, not each request

    return Front


@contextmanager
def openssl_tsa(workdir: Path) -> Iterator[Tsa]:
    """OpenSSL's TSA behind an HTTP front on a loopback port, stopped at the end."""
    ca, cert = make_authority(workdir)
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    tsa = Tsa(f"http://127.0.0.1:{server.server_address[1]}/", ca, cert)
    server.RequestHandlerClass = _handler(tsa, workdir)
    thread = threading.Thread(target=server.serve_forever, name="openssl-tsa", daemon=True)
    thread.start()
    try:
        yield tsa
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
