"""A fault-injecting HTTP/1.1 proxy in front of the local S3 server, for failure tests.

Real S3 fails in three ways a client must survive, and each is reproduced
here at a configurable rate, drawn from a seeded RNG:

* ``error_rate`` -- answer ``500 InternalError`` or ``503 SlowDown`` with an
  S3 XML error body *without* forwarding the request: nothing happened.
* ``drop_rate`` -- forward the request, wait for the server's answer, then
  close the client's connection without answering: the request *was* applied
  but the client cannot know, as when a connection dies in real life.
* ``cut_rate`` -- forward, then send the response's headers and only part of
  its body, then close: the "Failed to flush response stream" /
  ``IncompleteRead`` of a connection that breaks mid-body.

Requests are relayed byte for byte (``Content-Length`` and chunked bodies,
trailers included; ``Host`` is kept, so SigV4 signatures stay valid), except
that ``Expect: 100-continue`` is answered by the proxy itself and stripped
before forwarding. One daemon thread serves each client connection, with
keep-alive, over its own upstream connection. The proxy binds to 127.0.0.1
and refuses any upstream that is not 127.0.0.1.

    with FaultProxy(moto.endpoint, error_rate=0.1, drop_rate=0.05, seed=7) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint, ...)
        with proxy.paused():
            ...  # no faults here
        proxy.set_rates(cut_rate=0.2)
        assert proxy.faults > 0
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"
_MAX_LINE = 65536
_MAX_HEADERS = 200
_IO_CHUNK = 1 << 16
_ERRORS = {
    500: ("Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    503: ("Slow Down", "SlowDown", "Please reduce your request rate."),
}

FaultFilter = Callable[[str, str], bool]  # (method, target) -> may this request be faulted?


def first_requests(count: int, key: str, method: str | None = None) -> FaultFilter:
    """A fault filter: only the first ``count`` requests whose target holds ``key`` (and of ``method``) may fault.

    With ``error_rate=1.0``: N failures, then every request for ``key`` goes
    through -- what a retry budget is measured against.
    """
    seen = 0
    lock = threading.Lock()

    def eligible(asked: str, target: str) -> bool:
        nonlocal seen
        if key not in target or (method is not None and asked != method):
            return False
        with lock:
            seen += 1
            return seen <= count

    return eligible


class ProxyProtocolError(Exception):
    """A peer sent something that is not HTTP/1.x; the connection is closed."""


@dataclass(frozen=True)
class RequestRecord:
    """One request as the proxy saw it: what it was, and what the proxy did to it."""

    method: str
    target: str
    fault: str  # "none", "error_500", "error_503", "drop" or "cut"
    status: int | None  # the status the client saw (None: no answer)


@dataclass
class _Message:
    """An HTTP message head (request or response) with its raw body."""

    start: bytes  # request line or status line, without CRLF
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""  # exactly as on the wire (chunked framing included)

    def header(self, name: bytes) -> bytes | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value.strip()
        return None

    def tokens(self, name: bytes) -> set[bytes]:
        value = self.header(name)
        return {t.strip().lower() for t in value.split(b",")} if value else set()

    def head_bytes(self, drop: frozenset[bytes] = frozenset(), extra: tuple[bytes, ...] = ()) -> bytes:
        lines = [self.start] + [k + b": " + v for k, v in self.headers if k.lower() not in drop]
        return b"\r\n".join([*lines, *extra]) + b"\r\n\r\n"


def _read_line(rfile) -> bytes:
    line = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ProxyProtocolError("header line too long")
    return line


def _read_head(rfile) -> _Message | None:
    """The next message head, or None on a clean EOF before it starts."""
    start = _read_line(rfile)
    while start in (b"\r\n", b"\n"):  # stray CRLF between keep-alive messages
        start = _read_line(rfile)
    if not start:
        return None
    if not start.endswith(b"\n"):
        raise ProxyProtocolError("connection closed inside a message head")
    headers: list[tuple[bytes, bytes]] = []
    while True:
        line = _read_line(rfile)
        if not line.endswith(b"\n"):
            raise ProxyProtocolError("connection closed inside a message head")
        if line in (b"\r\n", b"\n"):
            return _Message(start.rstrip(b"\r\n"), headers)
        name, colon, value = line.rstrip(b"\r\n").partition(b":")
        if not colon or len(headers) >= _MAX_HEADERS:
            raise ProxyProtocolError(f"bad header line {line[:80]!r}")
        headers.append((name.strip(), value.strip()))


def _read_exact(rfile, size: int) -> bytes:
    data = rfile.read(size)
    if len(data) != size:
        raise ProxyProtocolError(f"connection closed after {len(data)} of {size} body bytes")
    return data


def _read_chunked(rfile) -> bytes:
    """A chunked body, raw: chunk-size lines, data, the last chunk and the trailers."""
    parts: list[bytes] = []
    while True:
        line = _read_line(rfile)
        if not line.endswith(b"\n"):
            raise ProxyProtocolError("connection closed inside a chunked body")
        parts.append(line)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            break
        parts.append(_read_exact(rfile, size + 2))  # data + CRLF
    while True:  # trailers, up to the empty line
        line = _read_line(rfile)
        if not line.endswith(b"\n"):
            raise ProxyProtocolError("connection closed inside chunked trailers")
        parts.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(parts)


def _read_body(rfile, message: _Message, *, until_close: bool) -> bytes:
    """The message's body as on the wire; ``until_close``: a response without framing ends at EOF."""
    if b"chunked" in message.tokens(b"transfer-encoding"):
        return _read_chunked(rfile)
    length = message.header(b"content-length")
    if length is not None:
        return _read_exact(rfile, int(length))
    if until_close:
        return rfile.read()
    return b""


def _status_of(response: _Message) -> int:
    parts = response.start.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ProxyProtocolError(f"bad status line {response.start[:80]!r}")
    return int(parts[1])


_HOP_BY_HOP = frozenset({b"connection", b"keep-alive"})


def _client_head(response: _Message, method: bytes, status: int, *, keep_alive: bool) -> bytes:
    """The response head for the client: the proxy's own hop-by-hop headers, the rest as received.

    The client's connection is the proxy's to keep alive or close, whatever
    the upstream does with its own (moto closes after every answer): a body
    the upstream ended by closing gets a ``Content-Length`` instead.
    """
    extra = [b"Connection: keep-alive" if keep_alive else b"Connection: close"]
    unframed = (
        method != b"HEAD"
        and status not in (204, 304)
        and response.header(b"content-length") is None
        and b"chunked" not in response.tokens(b"transfer-encoding")
    )
    if unframed:
        extra.append(b"Content-Length: %d" % len(response.body))
    return response.head_bytes(_HOP_BY_HOP, tuple(extra))


def _error_response(status: int, reason: str, code: str, text: str, target: str, close: bool) -> bytes:
    resource = target.split("?", 1)[0]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{text}</Message><Resource>{resource}</Resource>"
        "<RequestId>FAULTPROXY</RequestId></Error>"
    ).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/xml",
        f"Content-Length: {len(body)}",
        "x-amz-request-id: FAULTPROXY",
        "Connection: close" if close else "Connection: keep-alive",
    ]
    if status == 503:
        head.append("Retry-After: 0")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _loopback_port(url: str) -> int:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname != LOOPBACK or parts.port is None:
        raise ValueError(f"the fault proxy only forwards to http://{LOOPBACK}:<port>, not {url!r}")
    return parts.port


class _Upstream:
    """One keep-alive connection to the upstream server, reopened when the server closes it."""

    def __init__(self, port: int, timeout: float) -> None:
        self._port = port
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._rfile = None

    def _connect(self) -> None:
        self.close()
        self._sock = socket.create_connection((LOOPBACK, self._port), timeout=self._timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._rfile = self._sock.makefile("rb")

    def exchange(self, head: bytes, body: bytes, method: bytes) -> _Message:
        """Send one request, return the whole response; a stale kept-alive connection is retried once."""
        for attempt in range(2):
            fresh = self._sock is None
            if fresh:
                self._connect()
            try:
                assert self._sock is not None
                self._sock.sendall(head + body)
                response = self._read_response(method)
            except (OSError, ProxyProtocolError):
                self.close()
                if fresh or attempt:
                    raise
                continue
            if response is None:  # the server closed the idle connection before reading the request
                self.close()
                if fresh or attempt:
                    raise ProxyProtocolError("upstream closed the connection without answering")
                continue
            if b"close" in response.tokens(b"connection") or response.start.startswith(b"HTTP/1.0"):
                self.close()
            return response
        raise AssertionError("unreachable")

    def _read_response(self, method: bytes) -> _Message | None:
        while True:
            response = _read_head(self._rfile)
            if response is None:
                return None
            status = _status_of(response)
            if 100 <= status < 200:
                continue  # we answered 100-continue ourselves; nothing else is expected
            if method == b"HEAD" or status in (204, 304):
                return response
            framed = response.header(b"content-length") is not None or b"chunked" in response.tokens(
                b"transfer-encoding"
            )
            response.body = _read_body(self._rfile, response, until_close=True)
            if not framed:
                self.close()
            return response

    def close(self) -> None:
        if self._rfile is not None:
            with contextlib.suppress(OSError):
                self._rfile.close()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._rfile = None


class FaultProxy:
    """Listens on 127.0.0.1 (an ephemeral port) and relays to ``upstream`` with injected faults.

    Rates are probabilities per request, drawn in this order from one RNG
    seeded with ``seed``: error, then drop, then cut (their sum must not
    exceed 1). An error answer's status is drawn from ``error_statuses``
    (500 ``InternalError``, 503 ``SlowDown``; botocore treats the latter as
    throttling and backs off for seconds). ``fault_filter(method, target)`` may restrict which requests
    are eligible. Counters: :attr:`counts` (per fault kind -- ``error_500``,
    ``error_503``, ``drop``, ``cut`` -- plus ``requests``, ``forwarded`` and
    client ``connections``), :attr:`by_method`, and the most recent requests
    in :attr:`records`.
    """

    def __init__(
        self,
        upstream: str,
        *,
        error_rate: float = 0.0,
        drop_rate: float = 0.0,
        cut_rate: float = 0.0,
        seed: int = 0,
        fault_filter: FaultFilter | None = None,
        error_statuses: tuple[int, ...] = (500, 503),
        timeout: float = 60.0,
        keep_records: int = 10_000,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._upstream_port = _loopback_port(self.upstream)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        # Where a cut falls comes from its own stream: the fault sequence must not depend on the
        # sizes of the responses cut (an error body's request id, say).
        self._cut_rng = random.Random(seed + 1)
        self._rates = (0.0, 0.0, 0.0)
        self.set_rates(error_rate=error_rate, drop_rate=drop_rate, cut_rate=cut_rate)
        self.fault_filter = fault_filter
        self.error_statuses = error_statuses
        self.timeout = timeout
        self.counts: Counter[str] = Counter()
        self.by_method: Counter[str] = Counter()
        self.records: deque[RequestRecord] = deque(maxlen=keep_records)
        self._listener: socket.socket | None = None
        self._clients: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = threading.Event()
        self.port: int | None = None

    # -- configuration ------------------------------------------------------------------------

    @property
    def rates(self) -> dict[str, float]:
        error, drop, cut = self._rates
        return {"error_rate": error, "drop_rate": drop, "cut_rate": cut}

    def set_rates(
        self,
        *,
        error_rate: float | None = None,
        drop_rate: float | None = None,
        cut_rate: float | None = None,
    ) -> None:
        """Change some rates now; requests already being answered keep their fate."""
        current = self._rates
        new = (
            current[0] if error_rate is None else float(error_rate),
            current[1] if drop_rate is None else float(drop_rate),
            current[2] if cut_rate is None else float(cut_rate),
        )
        if any(not 0.0 <= rate <= 1.0 for rate in new) or sum(new) > 1.0:
            raise ValueError(f"fault rates must be in [0, 1] and sum to at most 1, got {new}")
        with self._lock:
            self._rates = new

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No faults inside the block (e.g. while building fixtures); the rates come back after."""
        saved = self.rates
        self.set_rates(error_rate=0.0, drop_rate=0.0, cut_rate=0.0)
        try:
            yield
        finally:
            self.set_rates(**saved)

    def requests_for(self, key: str, method: str | None = None) -> int:
        """How many of the kept :attr:`records` are requests whose target holds ``key`` (of ``method``)."""
        with self._lock:
            return sum(1 for r in self.records if key in r.target and (method is None or r.method == method))

    @property
    def faults(self) -> int:
        """How many requests were faulted so far, of every kind."""
        return sum(self.counts[k] for k in ("error_500", "error_503", "drop", "cut"))

    @property
    def live_threads(self) -> int:
        """Threads of this proxy still running (the acceptor and one per open connection)."""
        with self._lock:
            return sum(1 for thread in self._threads if thread.is_alive())

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("the fault proxy is not started")
        return f"http://{LOOPBACK}:{self.port}"

    def properties(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` s3.* properties with the endpoint pointed at this proxy."""
        return {**base, "s3.endpoint": self.endpoint}

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, 0))
        listener.listen(64)
        listener.settimeout(0.5)  # the acceptor looks at the stop flag at least this often
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop, "fault-proxy-accept")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection and wait (bounded) for the threads."""
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() on Linux
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._lock:
            clients = list(self._clients)
            threads = list(self._threads)
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                client.close()
        for thread in threads:
            thread.join(timeout / max(1, len(threads)))

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=self._tracked, args=(target, *args), name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _tracked(self, target: Callable[..., None], *args: object) -> None:
        try:
            target(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed by stop()
            client.settimeout(self.timeout)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._clients.add(client)
                self.counts["connections"] += 1
            self._spawn(self._serve, "fault-proxy-conn", client)

    # -- one client connection ----------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        upstream = _Upstream(self._upstream_port, self.timeout)
        rfile = client.makefile("rb")
        try:
            while not self._stopping.is_set():
                if not self._serve_one(client, rfile, upstream):
                    return
        except (OSError, ProxyProtocolError, ValueError):
            return  # the client went away or spoke nonsense: drop the connection
        finally:
            upstream.close()
            with contextlib.suppress(OSError):
                rfile.close()
            with contextlib.suppress(OSError):
                client.close()
            with self._lock:
                self._clients.discard(client)

    def _serve_one(self, client: socket.socket, rfile, upstream: _Upstream) -> bool:
        """Relay one request; False when the client connection must end."""
        request = _read_head(rfile)
        if request is None:
            return False
        method, _, rest = request.start.partition(b" ")
        target = rest.rsplit(b" ", 1)[0].decode("latin-1")
        keep_alive = b"close" not in request.tokens(b"connection") and not request.start.endswith(b"HTTP/1.0")
        if b"100-continue" in request.tokens(b"expect"):
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.body = _read_body(rfile, request, until_close=False)
        fault = self._draw(method.decode("latin-1"), target)
        self._count(method.decode("latin-1"))
        if fault.startswith("error_"):
            status = int(fault.removeprefix("error_"))
            reason, code, text = _ERRORS[status]
            # Recorded before the answer goes out, so records keep the order of the draws.
            self._fault_done(fault)
            self._record(method, target, fault, status)
            client.sendall(_error_response(status, reason, code, text, target, close=not keep_alive))
            return keep_alive
        response = upstream.exchange(request.head_bytes(frozenset({b"expect"})), request.body, method)
        with self._lock:
            self.counts["forwarded"] += 1
        status = _status_of(response)
        if fault == "drop" or (fault == "cut" and not response.body):
            self._fault_done("drop")
            self._record(method, target, "drop", None)
            return False
        head = _client_head(response, method, status, keep_alive=keep_alive and fault == "none")
        if fault == "cut":
            with self._lock:
                keep = self._cut_rng.randrange(len(response.body))
            self._fault_done("cut")
            self._record(method, target, "cut", status)
            client.sendall(head + response.body[:keep])
            return False
        self._record(method, target, "none", status)
        client.sendall(head + response.body)
        return keep_alive

    def _draw(self, method: str, target: str) -> str:
        if self.fault_filter is not None and not self.fault_filter(method, target):
            return "none"
        with self._lock:
            error, drop, cut = self._rates
            if error == drop == cut == 0.0:
                return "none"
            x = self._rng.random()
            if x < error:
                return f"error_{self._rng.choice(self.error_statuses)}"
            if x < error + drop:
                return "drop"
            if x < error + drop + cut:
                return "cut"
            return "none"

    def _count(self, method: str) -> None:
        with self._lock:
            self.counts["requests"] += 1
            self.by_method[method] += 1

    def _fault_done(self, fault: str) -> None:
        with self._lock:
            self.counts[fault] += 1

    def _record(self, method: bytes, target: str, fault: str, status: int | None) -> None:
        with self._lock:
            self.records.append(RequestRecord(method.decode("latin-1"), target, fault, status))
