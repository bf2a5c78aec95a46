"""`CommitCutter`: a TCP proxy in front of PostgreSQL that cuts one COMMIT's answer off.

It forwards every byte both ways. Once `arm(marker)` is called, the first
transaction on any connection whose statements carried `marker` (raw, or
hex-escaped as bytea text) has its COMMIT forwarded to the server, and then
the client's side of that connection is closed before the server's answer
can reach it. The server received the whole COMMIT, so it commits; the
client sees its connection lost while COMMIT was under way: the outcome is
unknown to it. Deterministic: no timing, only the message order.

`arm(marker, late=seconds)` cuts the client off first and forwards that COMMIT
only `late` seconds after: the service learns of the loss before the server has
even read the COMMIT, as it may when the server is busy.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress

COMMIT = b"COMMIT\x00"  # a simple query's text (or a Parse's), NUL-terminated
BEGIN = b"BEGIN"


class CommitCutter:
    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._guard = threading.Lock()
        self._markers: tuple[bytes, ...] = ()
        self._late = 0.0
        self.cut = threading.Event()  # set once the armed COMMIT was forwarded and cut off
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes, late: float = 0.0) -> None:
        """Cut the COMMIT of the next transaction that carries marker (once), forwarding it
        `late` seconds after the client's side is closed when late is not 0."""
        with self._guard:
            self._markers = (marker, marker.hex().encode())
            self._late = late
            self.cut.clear()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            threading.Thread(target=self._forward, args=(client, server), daemon=True).start()

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        """Client to server, watching each transaction's statements for the armed marker."""
        transaction = b""
        try:
            while data := client.recv(65536):
                begun = data.rfind(BEGIN)
                transaction = data[begun:] if begun >= 0 else transaction + data
                if COMMIT in data and self._take(transaction):
                    if self._late:  # the client knows of the loss before the server has it
                        _close(client)
                        time.sleep(self._late)
                    server.sendall(data)
                    return  # the server has the COMMIT; its answer goes nowhere
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            with suppress(OSError):
                server.shutdown(socket.SHUT_WR)

    def _take(self, transaction: bytes) -> bool:
        with self._guard:
            if not any(marker in transaction for marker in self._markers):
                return False
            self._markers = ()
            self.cut.set()
            return True


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(sink)
        _close(source)


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        sock.close()
