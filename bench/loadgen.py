"""HTTP load with `wrk`, for the benchmarks: a fixed request per wrk thread, figures as JSON.

`wrk` (Debian's package; `make wrk` installs it when run as root) drives the
load in C, so the load generator's CPU does not dominate what is measured. A
`Load` names the base URL, the request (one for every thread, or one per
thread: e.g. each connection its own session path and bearer token, with as
many threads as connections), the connection and thread counts and the
duration. `run` writes a Lua script that gives each thread its request in
`setup(thread)`/`init` (wrk then builds it once per thread), counts every
answer's status in `response` (the only Lua that runs per request), and
prints the figures as one JSON line from `done(summary, latency, requests)`;
nothing is read off wrk's screen report.

A status outside `Load.expected` fails the run (`UnexpectedStatus`, a
`LoadFailure` that names the count of each status and carries the figures),
and so does a socket error (connect, read, write, timeout) unless the caller
tolerates them, and a run that completed no request.
`run_together` runs several loads at once (one wrk process each), e.g. one
per service instance.

    from bench.loadgen import Load, Request, run
    result = run(Load("http://127.0.0.1:8080", (Request("GET", "/healthz"),), connections=16,
                      threads=2, seconds=5))
    print(result.requests_per_second, result.p50_ms, result.p99_ms)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.processes import held_signals

WRK = "wrk"
MARKER = "LOADGEN-FIGURES "  # the line done() prints; wrk's own report is ignored
INSTALL_HINT = "wrk is not on PATH: `make wrk` installs it as root (apt-get install wrk)"


class LoadFailure(RuntimeError):
    """wrk failed, an answer had an unexpected status, or a socket failed: the run stops."""


class UnexpectedStatus(LoadFailure):
    """Some answers had a status the load did not expect. `results` holds the figures of
    every load run together (each with its status counts), for a report of what happened."""

    def __init__(self, message: str, results: list[Result]) -> None:
        super().__init__(message)
        self.results = results


@dataclass(frozen=True)
class Request:
    """One HTTP request, sent again and again on a keep-alive connection."""

    method: str = "GET"
    path: str = "/"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None


@dataclass(frozen=True)
class Load:
    """What to send, how hard and how long.

    `requests` holds one request for every thread, or exactly one per thread
    (thread i sends requests[i] on each of its connections); `connections` must
    be a multiple of `threads` (wrk gives each thread connections // threads).
    """

    url: str  # base URL: scheme, host and port
    requests: Sequence[Request]
    connections: int = 1
    threads: int = 1
    seconds: int = 5
    expected: frozenset[int] = frozenset({200})
    timeout_seconds: int = 10  # an answer slower than this is a socket error (timeout)
    what: str = "load"  # names the run in errors
    count_header: str | None = None  # count the answers by this header's value (a worker's)

    def check(self) -> None:
        if self.seconds < 1:
            raise ValueError(f"{self.what}: wrk needs a duration of at least 1 s")
        if not 1 <= self.threads <= self.connections:
            raise ValueError(f"{self.what}: threads must be between 1 and the connection count")
        if self.connections % self.threads:
            raise ValueError(f"{self.what}: connections must be a multiple of threads")
        if len(self.requests) not in {1, self.threads}:
            raise ValueError(f"{self.what}: give one request, or one per thread")


@dataclass(frozen=True)
class Result:
    """wrk's figures of one run (or of several run together, see `combined`)."""

    requests: int
    seconds: float
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    statuses: Mapping[int, int]
    socket_errors: Mapping[str, int]  # connect, read, write, timeout
    # answers by the value of `Load.count_header` ("-" when absent, "other" when odd bytes)
    header_counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def non_2xx(self) -> int:
        return sum(count for status, count in self.statuses.items() if not 200 <= status < 300)

    @property
    def ok_per_second(self) -> float:
        """Answers with a 2xx status per second."""
        ok = self.requests - self.non_2xx
        return self.requests_per_second * ok / self.requests if self.requests else 0.0

    @property
    def socket_error_count(self) -> int:
        return sum(self.socket_errors.values())

    def figures(self) -> dict[str, float]:
        """req/s, p50 and p99 in ms: what the benchmarks print and put in their JSON."""
        return {
            "requests_per_second": round(self.requests_per_second, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "requests": self.requests,
        }


def available() -> bool:
    return shutil.which(WRK) is not None


def run(load: Load, *, tolerate_socket_errors: bool = False) -> Result:
    """Run load with wrk; its figures, or `LoadFailure`."""
    return run_together([load], tolerate_socket_errors=tolerate_socket_errors)[0]


def run_together(loads: Sequence[Load], *, tolerate_socket_errors: bool = False) -> list[Result]:
    """Run every load at once, one wrk process each; every one is checked, and every wrk
    process is gone when this returns, whatever happened."""
    if not available():
        raise LoadFailure(INSTALL_HINT)
    for load in loads:
        load.check()
    with tempfile.TemporaryDirectory(prefix="loadgen-") as tmp:
        processes: list[subprocess.Popen[str]] = []
        try:
            for number, load in enumerate(loads):
                script = Path(tmp) / f"load-{number}.lua"
                script.write_text(lua_script(load))  # bearer tokens: the temp dir is 0700
                with held_signals():
                    processes.append(
                        subprocess.Popen(
                            command(load, script),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL,
                            text=True,
                        )
                    )
            outputs = [process.communicate() for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    results = []
    for load, process, (out, err) in zip(loads, processes, outputs, strict=True):
        if process.returncode != 0:
            raise LoadFailure(f"{load.what}: wrk exited with {process.returncode}: {err[-1000:]}")
        results.append(_parse(load, out))
    unexpected = [_unexpected(load, result) for load, result in zip(loads, results, strict=True)]
    if any(unexpected):
        raise UnexpectedStatus("; ".join(filter(None, unexpected)), results)
    for load, result in zip(loads, results, strict=True):
        _check_sockets(load, result, tolerate_socket_errors)
    return results


def combined(results: Sequence[Result]) -> Result:
    """Loads run together as one: requests and req/s added up; p50, p99, mean and max are
    the largest of the parts (their latency distributions are not merged)."""
    statuses: dict[int, int] = {}
    errors: dict[str, int] = {}
    headers: dict[str, int] = {}
    for result in results:
        for status, count in result.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
        for kind, count in result.socket_errors.items():
            errors[kind] = errors.get(kind, 0) + count
        for value, count in result.header_counts.items():
            headers[value] = headers.get(value, 0) + count
    return Result(
        requests=sum(result.requests for result in results),
        seconds=max(result.seconds for result in results),
        requests_per_second=sum(result.requests_per_second for result in results),
        p50_ms=max(result.p50_ms for result in results),
        p99_ms=max(result.p99_ms for result in results),
        mean_ms=max(result.mean_ms for result in results),
        max_ms=max(result.max_ms for result in results),
        statuses=statuses,
        socket_errors=errors,
        header_counts=headers,
    )


def command(load: Load, script: Path) -> list[str]:
    return [
        WRK,
        f"--threads={load.threads}",
        f"--connections={load.connections}",
        f"--duration={load.seconds}s",
        f"--timeout={load.timeout_seconds}s",
        f"--script={script}",
        load.url.rstrip("/") + "/",
    ]


def lua_string(value: str | bytes) -> str:
    """A Lua string literal of value's bytes, every byte outside plain ASCII escaped."""
    raw = value.encode() if isinstance(value, str) else value
    safe = b" !#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{|}~"
    return '"' + "".join(chr(byte) if byte in safe else f"\\{byte:03d}" for byte in raw) + '"'


def lua_script(load: Load) -> str:
    """The wrk script: thread i gets request i (or the only one); done() prints JSON."""
    entries = []
    for request in load.requests:
        headers = ", ".join(
            f"[{lua_string(name)}] = {lua_string(value)}" for name, value in request.headers.items()
        )
        body = "nil" if request.body is None else lua_string(request.body)
        entries.append(
            f"  {{method = {lua_string(request.method)}, path = {lua_string(request.path)}, "
            f"headers = {{{headers}}}, body = {body}}},"
        )
    counted = "nil" if load.count_header is None else lua_string(load.count_header.lower())
    return (
        _LUA.replace("--REQUESTS--", "\n".join(entries))
        .replace("--MARKER--", MARKER)
        .replace("--COUNTED--", counted)
    )


# setup() runs in wrk's main Lua state, init() and response() in each thread's own; done()
# in the main state again, where thread:get copies each thread's status counts.
_LUA = """
local requests = {
--REQUESTS--
}
local threads = {}
local counted = --COUNTED--

function setup(thread)
  thread:set("number", #threads)
  table.insert(threads, thread)
end

function init(args)
  statuses = {}
  by_header = {}
  local mine = requests[(number % #requests) + 1]
  wrk.method = mine.method
  wrk.path = mine.path
  for name, value in pairs(mine.headers) do
    wrk.headers[name] = value
  end
  wrk.body = mine.body
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if counted then
    local value = "-"
    for name, given in pairs(headers) do
      if string.lower(name) == counted then
        value = string.match(given, "^[%w:._-]+$") and given or "other"
      end
    end
    by_header[value] = (by_header[value] or 0) + 1
  end
end

function done(summary, latency, requests)
  local counts = {}
  local values = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      counts[status] = (counts[status] or 0) + count
    end
    for value, count in pairs(thread:get("by_header")) do
      values[value] = (values[value] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(counts) do
    parts[#parts + 1] = string.format('"%d": %d', status, count)
  end
  local valued = {}
  for value, count in pairs(values) do
    valued[#valued + 1] = string.format('"%s": %d', value, count)
  end
  local e = summary.errors
  io.write("--MARKER--", string.format(
    '{"duration_us": %d, "requests": %d, "statuses": {%s}, "header_counts": {%s}, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %.1f, "p99": %.1f, "mean": %.1f, "max": %.1f}}\\n',
    summary.duration, summary.requests, table.concat(parts, ", "), table.concat(valued, ", "),
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
"""


def _parse(load: Load, out: str) -> Result:
    line = next((line for line in out.splitlines() if line.startswith(MARKER)), None)
    if line is None:
        raise LoadFailure(f"{load.what}: wrk printed no figures:\n{out[-1000:]}")
    figures = json.loads(line[len(MARKER) :])
    seconds = figures["duration_us"] / 1e6
    latency = figures["latency_us"]
    return Result(
        requests=figures["requests"],
        seconds=seconds,
        requests_per_second=figures["requests"] / seconds if seconds else 0.0,
        p50_ms=latency["p50"] / 1000,
        p99_ms=latency["p99"] / 1000,
        mean_ms=latency["mean"] / 1000,
        max_ms=latency["max"] / 1000,
        statuses={int(status): count for status, count in figures["statuses"].items()},
        socket_errors=figures["errors"],
        header_counts=figures["header_counts"],
    )


def _unexpected(load: Load, result: Result) -> str | None:
    """What was unexpected in the answers' statuses, or None."""
    unexpected = {
        status: count for status, count in result.statuses.items() if status not in load.expected
    }
    if not unexpected:
        return None
    wanted = "/".join(str(status) for status in sorted(load.expected))
    got = ", ".join(f"{count} x {status}" for status, count in sorted(unexpected.items()))
    return f"{load.what}: expected {wanted} only, got {got}"


def _check_sockets(load: Load, result: Result, tolerate_socket_errors: bool) -> None:
    if result.socket_error_count and not tolerate_socket_errors:
        raise LoadFailure(f"{load.what}: socket errors {dict(result.socket_errors)}")
    if result.requests == 0:
        raise LoadFailure(f"{load.what}: no request completed in {load.seconds} s")
