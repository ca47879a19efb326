"""A fault-injecting HTTP reverse proxy on loopback, in front of an S3 server.

The soak (tests/soak/driver.py) puts it between every CLI child and SeaweedFS: requests are
forwarded unchanged (the Host header as received, since SigV4 signs it), and by seeded
random rules per verb and key pattern some are answered with a fault instead: 503
SlowDown, 500 InternalError, a connection reset (before the request reaches the server,
or after it did, in the middle of the response) or a stall past the client's read
timeout. Stdlib only, one thread per client connection.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

HOST = "127.0.0.1"

#: fault kinds, as counted
SLOWDOWN = "slowdown_503"
INTERNAL = "internal_500"
RESET_BEFORE = "reset_before"  # the request never reaches the server
RESET_MID = "reset_mid"  # the server applied it; the response is cut in the middle
STALL = "stall"  # no answer until past the client's read timeout, then a reset
KINDS = (SLOWDOWN, INTERNAL, RESET_BEFORE, RESET_MID, STALL)

# headers that belong to one hop, not to the request (RFC 9110 7.6.1); `expect` is never
# signed by botocore and the proxy already answered it
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"}
)

_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><Resource>{resource}</Resource>"
    "<RequestId>soak-proxy</RequestId></Error>"
)


@dataclass(frozen=True)
class FaultRule:
    """Inject ``kind`` into a fraction ``rate`` of the requests of ``verb`` (``*``: any)
    whose path (with its query) matches ``pattern``; at most ``limit`` times if given."""

    verb: str
    pattern: str
    kind: str
    rate: float
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate {self.rate}: must be between 0 and 1")
        re.compile(self.pattern)

    def matches(self, verb: str, path: str) -> bool:
        return self.verb in ("*", verb) and re.search(self.pattern, path) is not None


@dataclass
class FaultPlan:
    """The rules, the seeded random source that applies them and the counts of what was
    injected; thread-safe. ``enabled`` False forwards everything."""

    rules: list[FaultRule] = field(default_factory=list)
    seed: int = 0
    stall_seconds: float = 3.0
    enabled: bool = False
    counts: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _rng: random.Random = field(init=False, repr=False)
    _used: Counter[int] = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, verb: str, path: str) -> str | None:
        """The fault to inject into this request, or None to forward it (counted)."""
        with self._lock:
            self.requests[verb] += 1
            if not self.enabled:
                return None
            for number, rule in enumerate(self.rules):
                if rule.limit is not None and self._used[number] >= rule.limit:
                    continue
                if rule.matches(verb, path) and self._rng.random() < rule.rate:
                    self._used[number] += 1
                    self.counts[rule.kind] += 1
                    return rule.kind
            return None

    def set_enabled(self, enabled: bool) -> None:
        with self._lock:
            self.enabled = enabled

    def replace_rules(self, rules: Iterable[FaultRule]) -> None:
        with self._lock:
            self.rules = list(rules)
            self._used.clear()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {kind: self.counts.get(kind, 0) for kind in KINDS}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and 100-continue answered for boto3
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:
        return  # quiet: the soak counts, it does not log every request

    def do_GET(self) -> None:
        self._proxy()

    def do_PUT(self) -> None:
        self._proxy()

    def do_POST(self) -> None:
        self._proxy()

    def do_DELETE(self) -> None:
        self._proxy()

    def do_HEAD(self) -> None:
        self._proxy()

    # --- one request -------------------------------------------------------------------
    def _proxy(self) -> None:
        body = self._read_body()
        fault = self.server.plan.choose(self.command, self.path)
        if fault == SLOWDOWN:
            self._error(503, "SlowDown", "Please reduce your request rate.")
        elif fault == INTERNAL:
            self._error(500, "InternalError", "We encountered an internal error.")
        elif fault == RESET_BEFORE:
            self._reset()
        elif fault == STALL:
            self._stall()
        else:
            self._forward(body, cut=fault == RESET_MID)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _forward(self, body: bytes, *, cut: bool) -> None:
        upstream = http.client.HTTPConnection(
            self.server.upstream_host, self.server.upstream_port, timeout=120
        )
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            chunked = False
            for name, value in self.headers.items():
                lower = name.lower()
                if lower in _HOP_HEADERS:
                    continue
                if lower == "transfer-encoding":
                    chunked = True  # decoded above: forwarded with its length
                    continue
                upstream.putheader(name, value)
            if chunked:
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body if body else None)
            response = upstream.getresponse()
            self._relay(response, cut=cut)
        finally:
            upstream.close()

    def _relay(self, response: http.client.HTTPResponse, *, cut: bool) -> None:
        """The server's answer as it came (bodies are blocks of a few MiB at most), or,
        with ``cut``, its first half and then a reset: in the body of a GET, in the headers
        of an empty answer. Either way the server has already acted on the request."""
        payload = b"" if self.command == "HEAD" else response.read()
        head = [f"HTTP/1.1 {response.status} {response.reason}"]
        for name, value in response.getheaders():
            if name.lower() in _HOP_HEADERS or name.lower() == "transfer-encoding":
                continue
            if name.lower() == "content-length" and self.command != "HEAD":
                value = str(len(payload))  # de-chunked above
            head.append(f"{name}: {value}")
        if self.command != "HEAD" and response.getheader("Content-Length") is None:
            head.append(f"Content-Length: {len(payload)}")
        whole = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
        if cut:
            self.wfile.write(whole[: len(whole) // 2])
            self._reset()
            return
        self.wfile.write(whole)
        self.wfile.flush()

    def _error(self, status: int, code: str, message: str) -> None:
        body = _ERROR_XML.format(code=code, message=message, resource=self.path).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _stall(self) -> None:
        """Say nothing until past the client's read timeout (or the proxy stops), then reset."""
        self.server.stopping.wait(self.server.plan.stall_seconds)
        self._reset()

    def _reset(self) -> None:
        """Close abruptly: SO_LINGER 0 sends a TCP RST instead of an orderly FIN."""
        with contextlib.suppress(OSError):
            self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.close()


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        parsed = urlparse(upstream)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"upstream {upstream!r}: expected http://host:port")
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self.plan = plan
        self.stopping = threading.Event()
        super().__init__((HOST, 0), _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        return  # a client that went away mid-answer (a kill, its own timeout) is normal here


class FaultProxy:
    """The proxy on a free loopback port, serving from a thread; ``plan`` steers it."""

    def __init__(self, upstream: str, plan: FaultPlan | None = None) -> None:
        self.plan = plan or FaultPlan()
        self._server = _ProxyServer(upstream, self.plan)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
