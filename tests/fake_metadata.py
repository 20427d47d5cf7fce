"""Fake cloud metadata services (GCE, AWS IMDSv2, Azure IMDS) on 127.0.0.1, for tests.

One threaded HTTP/1.1 server plays all three clouds at once; tests change what it
announces through plain attributes (each assignment wakes GCE long-polls) and can
make it misbehave (:attr:`FakeMetadata.fault`). It only ever binds 127.0.0.1.

GCE (``/computeMetadata/v1/...``, header ``Metadata-Flavor: Google`` or 403):
``instance/hostname``, ``instance/id``, ``instance/name``, ``instance/zone``,
``project/project-id``, ``instance/maintenance-event``, ``instance/preempted``; every
answer carries ``Metadata-Flavor: Google`` and an ``ETag`` derived from the value;
``?wait_for_change=true[&last_etag=E][&timeout_sec=N]`` blocks until the value's ETag
differs from ``E`` (without ``E``: from the current one) or ``N`` seconds pass.

AWS (``/latest/...``): IMDSv2 tokens from ``PUT /latest/api/token`` (header
``X-aws-ec2-metadata-token-ttl-seconds``, else 400); GETs under ``/latest/meta-data/``
need a live ``X-aws-ec2-metadata-token`` (else 401) unless :attr:`aws_imdsv1`, where
the token PUT is refused (403) and GETs need no token. ``spot/instance-action`` and
``events/recommendations/rebalance`` are 404 until set.

Azure (``/metadata/...``, header ``Metadata: true`` else 400, ``api-version`` query
parameter else 400): ``scheduledevents`` (GET; POST accepted and recorded),
``instance`` and ``instance/compute/name`` (``format=text`` for plain text).
``DocumentIncarnation`` goes up whenever :attr:`azure_events` changes.

:attr:`fault` applies to the notice endpoints (GCE maintenance-event/preempted, AWS
instance-action/rebalance, Azure scheduledevents) — to every endpoint when
:attr:`fault_scope` is ``"all"``:

* ``"500"``: HTTP 500;
* ``"garbage"``: 200 with junk bytes (invalid JSON, invalid UTF-8);
* ``"hang"``: read the request, never answer (until :meth:`stop` or the fault changes,
  then the connection is closed without an answer);
* ``"huge"``: 200 with a 10 MiB body;
* ``"dribble"``: the normal answer, one byte every 0.1 s;
* ``"close"``: close the connection in the middle of the response headers;
* ``"hostile_json"``: 200 with JSON of the right shape but wrong types (``action``
  123, ``Events`` "x", arrays nested 100,000 deep, and 32,000 deep to fit a 64 KiB
  body cap, ...; cycles through its variants request by request).

:meth:`FakeMetadata.stop` returns promptly whatever the clients do: it wakes
long-polls and hung requests and shuts down every open connection.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import http.server
import json
import secrets
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from typing import Any, Callable, Iterable, Optional

FAULTS = ("500", "garbage", "hang", "huge", "dribble", "close", "hostile_json")

GCE_PREFIX = "/computeMetadata/v1/"
GCE_MAINTENANCE = GCE_PREFIX + "instance/maintenance-event"
GCE_PREEMPTED = GCE_PREFIX + "instance/preempted"
GCE_HOSTNAME = GCE_PREFIX + "instance/hostname"
AWS_TOKEN = "/latest/api/token"
AWS_META = "/latest/meta-data/"
AWS_INSTANCE_ACTION = AWS_META + "spot/instance-action"
AWS_REBALANCE = AWS_META + "events/recommendations/rebalance"
AZURE_EVENTS = "/metadata/scheduledevents"
AZURE_INSTANCE = "/metadata/instance"
AZURE_API_VERSION = "2020-07-01"

NOTICE_PATHS = frozenset(
    {GCE_MAINTENANCE, GCE_PREEMPTED, AWS_INSTANCE_ACTION, AWS_REBALANCE, AZURE_EVENTS}
)

HUGE_BODY_SIZE = 10 << 20
DRIBBLE_INTERVAL = 0.1
NESTING = 100_000
_DEEP = "[" * NESTING + "]" * NESTING
#: Nesting that still fits a 64 KiB body cap, so that it reaches the JSON parser.
_DEEP_SMALL = "[" * 32_000 + "]" * 32_000
_GARBAGE = b"\x00\xff\xfe<html>{{ not json ]]\x07\xc3\x28 garbage \x00"
_AWS_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


# ---------------------------------------------------------------- payloads


def rfc3339(unix: float) -> str:
    """``2024-01-02T03:04:05Z`` (whole seconds, UTC), as AWS writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def rfc1123(unix: float) -> str:
    """``Mon, 19 Sep 2016 18:29:47 GMT``, as Azure writes ``NotBefore``."""
    return email.utils.formatdate(unix, usegmt=True)


def aws_action(
    action: str = "terminate", in_seconds: float = 120.0, now: Optional[float] = None
) -> dict:
    """An ``spot/instance-action`` document: ``action`` at ``now + in_seconds``."""
    at = (time.time() if now is None else now) + in_seconds
    return {"action": action, "time": rfc3339(at)}


def aws_rebalance_notice(in_seconds: float = 0.0, now: Optional[float] = None) -> dict:
    """An ``events/recommendations/rebalance`` document."""
    return {"noticeTime": rfc3339((time.time() if now is None else now) + in_seconds)}


def azure_event(
    event_type: str = "Preempt",
    resources: Iterable[str] = ("vm0",),
    not_before_in: Optional[float] = 30.0,
    now: Optional[float] = None,
) -> dict:
    """A scheduled event; ``not_before_in=None`` gives an empty ``NotBefore`` (started)."""
    not_before = (
        ""
        if not_before_in is None
        else rfc1123((time.time() if now is None else now) + not_before_in)
    )
    return {
        "EventId": str(uuid.uuid4()).upper(),
        "EventStatus": "Scheduled",
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "NotBefore": not_before,
        "Description": f"Fake {event_type} event",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def etag(value: str) -> str:
    """The ETag the fake GCE server gives ``value``."""
    return hashlib.sha1(value.encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- server


@dataclasses.dataclass
class _Response:
    status: int
    body: bytes = b""
    headers: list = dataclasses.field(default_factory=list)

    def raw(self, head_only: bool = False, length: Optional[int] = None) -> bytes:
        reason = http.server.BaseHTTPRequestHandler.responses.get(self.status, ("",))[0]
        lines = [f"HTTP/1.1 {self.status} {reason}", "Server: FakeMetadata"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        lines.append(f"Content-Length: {len(self.body) if length is None else length}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def _text(status: int, body: Any, *headers: tuple, content_type: str = "text/plain") -> _Response:
    data = body if isinstance(body, bytes) else str(body).encode("utf-8")
    return _Response(status, data, [("Content-Type", content_type), *headers])


def _json(status: int, doc: Any, *headers: tuple) -> _Response:
    return _text(status, json.dumps(doc), *headers, content_type="application/json")


#: Returned by a route that must close the connection without answering.
_ABORT = _Response(0)

_STATE_DEFAULTS: dict = {
    "gce_maintenance_event": "NONE",
    "gce_preempted": "FALSE",
    "gce_hostname": "vm0.c.fake-project.internal",
    "aws_instance_action": None,
    "aws_rebalance": None,
    "aws_imdsv1": False,
    "azure_events": (),
    "azure_vm_name": "vm0",
    "fault": None,
    "fault_scope": "notices",
}


def _state(name: str, doc: str) -> property:
    def get(self: FakeMetadata) -> Any:
        with self._cond:
            return self._state[name]

    def set_(self: FakeMetadata, value: Any) -> None:
        self.set(**{name: value})

    return property(get, set_, doc=doc)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: FakeMetadata) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner._track(request, True)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        try:
            super().shutdown_request(request)
        finally:
            self.owner._track(request, False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that give up (timeouts, hostile modes) reset connections: expected.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: Idle keep-alive connections end by themselves too (stop() ends them at once).
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        self.server.owner._serve(self)  # type: ignore[attr-defined]

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _serve


class FakeMetadata:
    """GCE, AWS and Azure metadata services on ``127.0.0.1:<free port>`` (see the module).

    Use as a context manager, or :meth:`start` / :meth:`stop`. State is set through
    the attributes below (or :meth:`set` for several at once, atomically); every
    change wakes GCE long-polls. :attr:`azure_events` reads back as a tuple: assign
    a new sequence, do not mutate.
    """

    gce_maintenance_event = _state("gce_maintenance_event", "GCE instance/maintenance-event")
    gce_preempted = _state("gce_preempted", 'GCE instance/preempted ("TRUE"/"FALSE")')
    gce_hostname = _state("gce_hostname", "GCE instance/hostname")
    aws_instance_action = _state("aws_instance_action", "spot/instance-action doc; None = 404")
    aws_rebalance = _state("aws_rebalance", "rebalance recommendation doc; None = 404")
    aws_imdsv1 = _state("aws_imdsv1", "IMDSv1 only: token PUT 403, GETs need no token")
    azure_events = _state("azure_events", "Azure scheduled events (dicts)")
    azure_vm_name = _state("azure_vm_name", "Azure compute/name of this VM")
    fault = _state("fault", "one of FAULTS, or None")
    fault_scope = _state("fault_scope", '"notices" (notice endpoints) or "all"')

    def __init__(self, **state: Any) -> None:
        self._cond = threading.Condition()
        self._state = dict(_STATE_DEFAULTS)
        self._incarnation = 1
        self._tokens: dict = {}
        self._requests: list = []
        self._connections: set = set()
        self._variant = 0
        self._stopping = False
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        if state:
            self.set(**state)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> FakeMetadata:
        if self._server is not None:
            raise RuntimeError("already started")
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name="fake-metadata",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving and ends every connection; returns promptly. Idempotent."""
        server = self._server
        if server is None:
            return
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        server.shutdown()
        with self._cond:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        with self._cond:  # handler threads close their sockets on the way out
            self._cond.wait_for(lambda: not self._connections, timeout=1.0)

    def __enter__(self) -> FakeMetadata:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("not started")
        return self._server.server_address[1]

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}"

    def env(self, cloud: str) -> dict:
        """The variables pointing a process at this server for ``cloud`` (no forcing)."""
        if cloud == "gce":
            return {"GCE_METADATA_IP": self.host}
        if cloud == "aws":
            return {"TF_FAILURE_HANDLING_AWS_METADATA_URL": self.base}
        if cloud == "azure":
            return {"TF_FAILURE_HANDLING_AZURE_METADATA_URL": self.base}
        raise ValueError(f"unknown cloud {cloud!r}")

    # ------------------------------------------------------------ control

    def set(self, **changes: Any) -> None:
        """Sets several state attributes at once and wakes long-polls."""
        for name in changes:
            if name not in _STATE_DEFAULTS:
                raise AttributeError(f"FakeMetadata has no state {name!r}")
        if changes.get("fault") is not None and changes["fault"] not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS} or None, not {changes['fault']!r}")
        if changes.get("fault_scope", "notices") not in ("notices", "all"):
            raise ValueError("fault_scope must be 'notices' or 'all'")
        if "azure_events" in changes:
            changes["azure_events"] = tuple(changes["azure_events"])
        with self._cond:
            if "azure_events" in changes and changes["azure_events"] != self._state["azure_events"]:
                self._incarnation += 1
            self._state.update(changes)
            self._cond.notify_all()

    def revoke_aws_tokens(self) -> None:
        """Invalidates every IMDSv2 token handed out (GETs with them get 401)."""
        with self._cond:
            self._tokens.clear()

    @property
    def aws_tokens(self) -> list:
        with self._cond:
            return list(self._tokens)

    def wait_for_aws_tokens(self, timeout: float = 10.0) -> list:
        """The live IMDSv2 tokens once there is one (a PUT is recorded when it arrives,
        before its token is made), or [] after ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._tokens, timeout)
            return list(self._tokens)

    @property
    def azure_incarnation(self) -> int:
        with self._cond:
            return self._incarnation

    @property
    def requests(self) -> list:
        """``(method, path with query, headers with lower-case names)`` of every request."""
        with self._cond:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._cond:
            self._requests.clear()

    def count(self, path: str, method: Optional[str] = None) -> int:
        """Requests seen for ``path`` (query string ignored), of ``method`` if given."""
        with self._cond:
            return sum(1 for r in self._requests if _matches(r, path, method))

    def wait_for_requests(
        self, path: str, count: int = 1, timeout: float = 30.0, method: Optional[str] = None
    ) -> bool:
        """Waits until ``count`` requests for ``path`` have been seen in all; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: sum(1 for r in self._requests if _matches(r, path, method)) >= count,
                timeout,
            )

    # ------------------------------------------------------------ serving

    def _track(self, conn: Any, add: bool) -> None:
        with self._cond:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
                self._cond.notify_all()

    def _serve(self, h: _Handler) -> None:
        method = h.command
        split = urllib.parse.urlsplit(h.path)
        path = split.path
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(split.query).items()}
        headers = {k.lower(): v for k, v in h.headers.items()}
        length = headers.get("content-length", "0")
        if length.isdigit() and 0 < int(length) <= 1 << 20:
            h.rfile.read(int(length))
        with self._cond:
            self._requests.append((method, h.path, headers))
            self._cond.notify_all()

        def route(wait: bool) -> _Response:
            if path == "/" or path.startswith("/computeMetadata"):
                return self._gce(method, path, query, headers, wait)
            if path.startswith("/latest"):
                return self._aws(method, path, headers)
            if path.startswith("/metadata"):
                return self._azure(method, path, query, headers)
            return _text(404, "not found")

        while True:
            with self._cond:
                fault = self._state["fault"]
                scope = self._state["fault_scope"]
            if fault is not None and (scope == "all" or path in NOTICE_PATHS):
                self._fault(h, fault, path, lambda: route(False))
                return
            response = route(True)
            if response is not _RETRY:
                break
        if response is _ABORT:
            h.close_connection = True
            return
        h.wfile.write(response.raw(head_only=method == "HEAD"))

    # ------------------------------------------------------------ faults

    def _fault(self, h: _Handler, fault: str, path: str, quiet: Callable[[], _Response]) -> None:
        if fault == "500":
            h.wfile.write(_text(500, "Internal Server Error").raw())
        elif fault == "garbage":
            h.wfile.write(_text(200, _GARBAGE, content_type="application/json").raw())
        elif fault == "hostile_json":
            h.wfile.write(_json_text(200, self._hostile(path)).raw())
        elif fault == "hang":
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._state["fault"] != "hang")
            h.close_connection = True
        elif fault == "close":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: appl")
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        elif fault == "huge":
            head = _Response(200, headers=[("Content-Type", "application/json")])
            h.wfile.write(head.raw(head_only=True, length=HUGE_BODY_SIZE))
            chunk = b"A" * (64 << 10)
            for _ in range(HUGE_BODY_SIZE // len(chunk)):
                if self._stopping:
                    break
                h.wfile.write(chunk)
            h.close_connection = True
        elif fault == "dribble":
            data = quiet()
            data = _text(503, "stopping") if data is _ABORT or data is _RETRY else data
            for i in range(len(raw := data.raw())):
                with self._cond:
                    if self._cond.wait_for(lambda: self._stopping, DRIBBLE_INTERVAL):
                        break
                h.wfile.write(raw[i : i + 1])
            h.close_connection = True

    def _hostile(self, path: str) -> str:
        with self._cond:
            self._variant += 1
            n = self._variant
        if path == AWS_INSTANCE_ACTION:
            variants: list = [
                {"action": 123, "time": rfc3339(time.time() + 60)},
                {"action": ["terminate"], "time": rfc3339(time.time() + 60)},
                {"action": {"terminate": True}, "time": None},
                {"action": None, "time": 5},
                "terminate",
                None,
                _DEEP,
            ]
        elif path == AWS_REBALANCE:
            variants = [{"noticeTime": 5}, {"noticeTime": [[]]}, "x", _DEEP]
        elif path == AZURE_EVENTS:
            variants = [
                {"DocumentIncarnation": "x", "Events": "x"},
                {"DocumentIncarnation": 9, "Events": [{"EventType": 123, "Resources": "vm0"}]},
                {"DocumentIncarnation": 9, "Events": [{"EventType": ["Preempt"]}]},
                {"DocumentIncarnation": 9, "Events": [{"EventType": "Preempt", "Resources": [7]}]},
                {"DocumentIncarnation": 9, "Events": [123, None, "Preempt"]},
                {"DocumentIncarnation": 9, "Events": {"EventType": 5}},
                [],
                _DEEP,
            ]
        else:  # GCE's values are text; give it JSON it must not take for a notice
            variants = [{"value": 123}, [None], 123, _DEEP]
        variants += [_DEEP_SMALL, "deep-object"]
        chosen = variants[n % len(variants)]
        if chosen is _DEEP or chosen is _DEEP_SMALL:
            return chosen
        if chosen == "deep-object":  # the right keys, nested values
            return '{"Events": ' + _DEEP_SMALL[:30_000] + _DEEP_SMALL[-30_000:] + "}"
        return json.dumps(chosen)

    # ------------------------------------------------------------ GCE

    def _gce(self, method: str, path: str, query: dict, headers: dict, wait: bool) -> _Response:
        flavor = ("Metadata-Flavor", "Google")
        if headers.get("metadata-flavor") != "Google":
            return _text(403, "Missing Metadata-Flavor:Google header.", flavor)
        if method not in ("GET", "HEAD"):
            return _text(405, "Method not allowed", flavor)
        listings = {
            "/": "computeMetadata/\n",
            "/computeMetadata/": "v1/\n",
            "/computeMetadata/v1/": "instance/\nproject/\n",
        }
        if path in listings:
            return _text(200, listings[path], flavor, content_type="application/text")
        key = path[len(GCE_PREFIX) :] if path.startswith(GCE_PREFIX) else None
        fixed = {
            "instance/id": "4520031799277581759",
            "instance/name": "vm0",
            "instance/zone": "projects/123456789/zones/us-central1-a",
            "project/project-id": "fake-project",
            "project/numeric-project-id": "123456789",
        }
        states = {
            "instance/hostname": "gce_hostname",
            "instance/maintenance-event": "gce_maintenance_event",
            "instance/preempted": "gce_preempted",
        }
        if key in fixed:
            return _text(200, fixed[key], flavor, ("ETag", etag(fixed[key])))
        if key not in states:
            return _text(404, "Not Found", flavor)
        name = states[key]
        with self._cond:
            value = self._state[name]
            if wait and query.get("wait_for_change", "").lower() == "true":
                since = query.get("last_etag") or etag(value)
                try:
                    limit = float(query["timeout_sec"]) if "timeout_sec" in query else None
                except ValueError:
                    return _text(400, "bad timeout_sec", flavor)
                deadline = None if limit is None else time.monotonic() + limit
                while etag(self._state[name]) == since:
                    if self._stopping:
                        return _ABORT
                    if self._state["fault"] is not None:
                        return _RETRY
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(left)
                value = self._state[name]
        return _text(200, value, flavor, ("ETag", etag(value)), content_type="application/text")

    # ------------------------------------------------------------ AWS

    def _aws(self, method: str, path: str, headers: dict) -> _Response:
        server = ("Server", "EC2ws")
        if path == AWS_TOKEN:
            if method != "PUT":
                return _text(405, "Method Not Allowed", server)
            with self._cond:
                if self._state["aws_imdsv1"]:
                    return _text(403, "Forbidden", server)
                ttl = headers.get(_AWS_TTL_HEADER.lower(), "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return _text(400, "Bad Request", server)
                token = secrets.token_urlsafe(36)
                self._tokens[token] = time.monotonic() + int(ttl)
                self._cond.notify_all()
            return _text(200, token, server, (_AWS_TTL_HEADER, ttl))
        if method not in ("GET", "HEAD"):
            return _text(405, "Method Not Allowed", server)
        with self._cond:
            token = headers.get("x-aws-ec2-metadata-token")
            live = token is not None and self._tokens.get(token, 0) > time.monotonic()
            if not self._state["aws_imdsv1"] and not live:
                return _text(401, "Unauthorized", server)
            action = self._state["aws_instance_action"]
            rebalance = self._state["aws_rebalance"]
        not_found = _text(404, _AWS_404, server, content_type="text/html")
        if path in (AWS_META, AWS_META.rstrip("/")):
            return _text(200, _AWS_LISTING, server)
        if path == AWS_META + "instance-id":
            return _text(200, "i-0fake0000metadata", server)
        if path == AWS_INSTANCE_ACTION:
            return not_found if action is None else _json(200, action, server)
        if path == AWS_REBALANCE:
            return not_found if rebalance is None else _json(200, rebalance, server)
        return not_found

    # ------------------------------------------------------------ Azure

    def _azure(self, method: str, path: str, query: dict, headers: dict) -> _Response:
        if headers.get("metadata", "").lower() != "true":
            return _json(400, {"error": "Bad request. Required metadata header not specified"})
        if "api-version" not in query:
            return _json(400, {"error": "Bad request. api-version was not specified"})
        with self._cond:
            events = [dict(e) for e in self._state["azure_events"]]
            incarnation = self._incarnation
            name = self._state["azure_vm_name"]
        path = path.rstrip("/")
        if path == AZURE_EVENTS:
            if method == "POST":
                return _text(200, "")
            if method not in ("GET", "HEAD"):
                return _json(405, {"error": "Method not allowed"})
            return _json(200, {"DocumentIncarnation": incarnation, "Events": events})
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": "Method not allowed"})
        compute = {
            "name": name,
            "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
            "location": "westus2",
            "vmSize": "Standard_D2s_v3",
            "priority": "Spot",
        }
        if path == AZURE_INSTANCE:
            return _json(200, {"compute": compute, "network": {"interface": []}})
        if path.startswith(AZURE_INSTANCE + "/compute/"):
            leaf = path[len(AZURE_INSTANCE + "/compute/") :]
            if leaf in compute:
                if query.get("format") == "text":
                    return _text(200, compute[leaf])
                return _json(200, compute[leaf])
        return _json(404, {"error": "Not found"})


#: Returned by a GCE long-poll interrupted by a fault: serve the fault instead.
_RETRY = _Response(-1)

_AWS_LISTING = "\n".join(
    [
        "ami-id",
        "events/",
        "hostname",
        "instance-action",
        "instance-id",
        "instance-type",
        "local-ipv4",
        "placement/",
        "spot/",
    ]
)
_AWS_404 = (
    '<?xml version="1.0" encoding="iso-8859-1"?>\n<html><head><title>404 - Not Found</title>'
    "</head><body><h1>404 - Not Found</h1></body></html>\n"
)


def _json_text(status: int, body: str) -> _Response:
    return _text(status, body, content_type="application/json")


def _matches(record: tuple, path: str, method: Optional[str]) -> bool:
    return record[1].split("?", 1)[0] == path and (method is None or record[0] == method)
