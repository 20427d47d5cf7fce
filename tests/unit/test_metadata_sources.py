"""Cloud metadata termination sources (``_native.MetadataWatch``, each
cloud's ``probe`` in ``_native.platforms()``).

Everything runs against ``tests/fake_metadata.py`` on 127.0.0.1, which plays GCE,
AWS and Azure at once. The first section checks the fake itself (it is shared with
the integration tests); the rest checks the native watcher: a notice per cloud with
its deadline, AWS's token handling, Azure's event filtering, the ``wake`` argument,
and that no hostile answer (every fault kind, every cloud) raises, fakes a notice,
blocks ``close()`` or ends polling.
"""

from __future__ import annotations

import calendar
import email.utils
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Optional

import pytest
from fake_metadata import (
    AWS_INSTANCE_ACTION,
    AWS_TOKEN,
    AZURE_EVENTS,
    FAULTS,
    GCE_MAINTENANCE,
    GCE_PREEMPTED,
    FakeMetadata,
    aws_action,
    aws_rebalance_notice,
    azure_event,
    etag,
)
from tf_failure_handling import _native


def _probe(cloud: str):
    """The core's probe of ``cloud``: its row's ``probe`` in ``_native.platforms()``."""
    return next(row["probe"] for row in _native.platforms() if row["name"] == cloud)


CLOUDS = ("gce", "aws", "azure")
#: MetadataWatch's default poll interval; a notice is seen within it plus a request.
INTERVAL = 0.5
#: How long a test waits for a notice, a request or close(): a bound that only turns a
#: hang into a failure. How soon these happen (within an interval plus a request) is a
#: figure for a bench; here every "not yet" is waited for by its event, never a delay.
SEEN_WITHIN = 20.0
#: Pacing of the hostile cases, so that 21 of them fit in well under a minute.
FAULT_TIMING = {"interval": 0.2, "request_timeout": 0.5}
#: How long a quiet server is watched for a notice that must not come.
QUIET = 0.6
#: FakeMetadata's bounds on a test's waits for requests and for an IMDSv2 token (their
#: defaults), passed by name so that the pytest-timeout marks can add them up.
REQUESTS_WITHIN = 30.0
TOKENS_WITHIN = 10.0


@pytest.fixture
def fake():
    with FakeMetadata() as server:
        yield server


def _free_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ------------------------------------------------------------ the fake itself


def _http(url: str, headers: Optional[dict] = None, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(), {k.lower(): v for k, v in e.headers.items()}


GOOGLE = {"Metadata-Flavor": "Google"}


def test_fake_binds_loopback_only(fake):
    assert fake.base == f"http://127.0.0.1:{fake.port}"
    assert fake.env("gce") == {"GCE_METADATA_IP": f"127.0.0.1:{fake.port}"}
    assert fake.env("aws") == {"TF_FAILURE_HANDLING_AWS_METADATA_URL": fake.base}
    assert fake.env("azure") == {"TF_FAILURE_HANDLING_AZURE_METADATA_URL": fake.base}
    with pytest.raises(ValueError):
        fake.env("ibm")


def test_fake_gce_header_etag_and_long_poll(fake):
    assert _http(fake.base + GCE_MAINTENANCE)[0] == 403
    status, body, headers = _http(fake.base + GCE_MAINTENANCE, GOOGLE)
    assert (status, body, headers["metadata-flavor"]) == (200, b"NONE", "Google")
    assert headers["etag"] == etag("NONE")
    timer = threading.Timer(0.2, setattr, (fake, "gce_preempted", "TRUE"))
    start = time.monotonic()
    timer.start()
    url = f"{fake.base}{GCE_PREEMPTED}?wait_for_change=true&last_etag={etag('FALSE')}"
    # Answered on the change (0.2 s), not at timeout_sec.
    status, body, headers = _http(url + "&timeout_sec=60", GOOGLE, timeout=60.0)
    assert (status, body, headers["etag"]) == (200, b"TRUE", etag("TRUE"))
    assert 0.15 < time.monotonic() - start < 30.0
    timer.join()
    # An ETag that is already stale answers at once; an unchanged value waits timeout_sec.
    assert _http(url + "&timeout_sec=5", GOOGLE)[1] == b"TRUE"
    start = time.monotonic()
    assert _http(f"{fake.base}{GCE_MAINTENANCE}?wait_for_change=true&timeout_sec=0.3", GOOGLE)[1]
    assert time.monotonic() - start > 0.25


def test_fake_aws_tokens(fake):
    assert _http(fake.base + AWS_TOKEN, method="PUT")[0] == 400
    assert _http(fake.base + AWS_INSTANCE_ACTION)[0] == 401
    status, token, _ = _http(
        fake.base + AWS_TOKEN, {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT"
    )
    assert status == 200
    auth = {"X-aws-ec2-metadata-token": token.decode()}
    assert _http(fake.base + AWS_INSTANCE_ACTION, auth)[0] == 404
    fake.aws_instance_action = action = aws_action("stop", 60)
    assert json.loads(_http(fake.base + AWS_INSTANCE_ACTION, auth)[1]) == action
    fake.revoke_aws_tokens()
    assert _http(fake.base + AWS_INSTANCE_ACTION, auth)[0] == 401
    fake.aws_imdsv1 = True
    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    assert _http(fake.base + AWS_TOKEN, ttl, "PUT")[0] == 403
    assert _http(fake.base + AWS_INSTANCE_ACTION)[0] == 200


def test_fake_azure(fake):
    url = fake.base + AZURE_EVENTS + "?api-version=2020-07-01"
    assert _http(url)[0] == 400
    assert _http(fake.base + AZURE_EVENTS, {"Metadata": "true"})[0] == 400
    doc = json.loads(_http(url, {"Metadata": "true"})[1])
    assert doc["Events"] == []
    fake.azure_events = [azure_event("Preempt", ("vm0",), 30)]
    later = json.loads(_http(url, {"Metadata": "true"})[1])
    assert later["DocumentIncarnation"] == doc["DocumentIncarnation"] + 1
    assert later["Events"][0]["EventType"] == "Preempt"
    name = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
    assert _http(fake.base + name, {"Metadata": "true"})[1] == b"vm0"


def test_fake_payload_formats():
    now = 1_474_309_787.0  # Mon, 19 Sep 2016 18:29:47 GMT
    assert aws_action("terminate", 0, now=now) == {
        "action": "terminate",
        "time": "2016-09-19T18:29:47Z",
    }
    assert azure_event(not_before_in=0, now=now)["NotBefore"] == "Mon, 19 Sep 2016 18:29:47 GMT"
    assert azure_event(not_before_in=None)["NotBefore"] == ""
    assert aws_rebalance_notice(0, now=now) == {"noticeTime": "2016-09-19T18:29:47Z"}


def test_fake_rejects_unknown_state(fake):
    with pytest.raises(ValueError):
        fake.fault = "slow"
    with pytest.raises(AttributeError):
        fake.set(gce_maintenance="x")


@pytest.mark.timeout(30)
def test_fake_stops_at_once_with_clients_parked(fake):
    parked = []
    for fault, path, headers in [
        ("hang", AWS_INSTANCE_ACTION, ""),
        ("dribble", AZURE_EVENTS + "?api-version=1", "Metadata: true\r\n"),
    ]:
        fake.fault = fault
        s = socket.create_connection(("127.0.0.1", fake.port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        parked.append(s)
        fake.wait_for_requests(path.split("?")[0], 1, 5)
    long_poll = socket.create_connection(("127.0.0.1", fake.port))
    fake.fault = None
    long_poll.sendall(
        f"GET {GCE_MAINTENANCE}?wait_for_change=true HTTP/1.1\r\nHost: x\r\n"
        "Metadata-Flavor: Google\r\n\r\n".encode()
    )
    parked.append(long_poll)
    parked.append(socket.create_connection(("127.0.0.1", fake.port)))  # idle
    assert fake.wait_for_requests(GCE_MAINTENANCE, 1, 5)
    fake.fault = "hang"
    fake.stop()  # returns although requests are parked (a hang would fail the test)
    for s in parked:
        s.close()


# ------------------------------------------------------------ the native watcher


class _Watched:
    """A ``MetadataWatch`` and the inbox it posts into (``wake``, or its own): what a
    caller of the watch can see of it."""

    def __init__(self, cloud: str, fake: FakeMetadata, wake: Any = None, **timing: float):
        self.inbox = wake if wake is not None else _native.Inbox()
        self.watch = _native.MetadataWatch(cloud, fake.base, self.inbox, **timing)
        self.fake = fake
        self.posted: list = []  # (description, deadline) of each notice posted

    def close(self) -> None:
        self.watch.close()


def _watch(cloud: str, fake: FakeMetadata, wake: Any = None, **timing: float) -> _Watched:
    return _Watched(cloud, fake, wake, **timing)


def _notice(w: _Watched, timeout: float) -> Optional[tuple]:
    """The first notice ``w`` posted into its inbox, ``(description, deadline)``,
    waiting up to ``timeout`` seconds for it; None if none by then."""
    if not w.posted:
        item = w.inbox.recv(timeout)
        if item is not None:
            assert isinstance(item, _native.Inbox.Input.Notice), item
            w.posted.append((item.source, item.deadline))
    return w.posted[0] if w.posted else None


def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + SEEN_WITHIN
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {SEEN_WITHIN:g}s waiting for {what}"
        time.sleep(0.005)


def _polled(w: _Watched, requests: int = 1) -> None:
    """Waits until the fake has answered ``requests`` requests (of every watch on it)."""
    _until(lambda: len(w.fake.requests) >= requests, f"{requests} requests")


def _warnings(caplog: Any, kind: str) -> list:
    """The watches' warnings of a failed poll of ``kind`` (``"request failed"`` or
    ``"unexpected answer"``: a body that does not parse); one per endpoint and kind."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and f": {kind}: " in r.getMessage()
    ]


@pytest.fixture
def watches():
    """``make(cloud, fake, **kw)``; every watch is closed at teardown."""
    made: list = []

    def make(cloud: str, fake: FakeMetadata, wake: Any = None, **timing: float) -> Any:
        w = _watch(cloud, fake, wake, **timing)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def _aws_deadline(action: dict) -> float:
    return float(calendar.timegm(time.strptime(action["time"], "%Y-%m-%dT%H:%M:%SZ")))


def _azure_deadline(event: dict) -> float:
    return email.utils.parsedate_to_datetime(event["NotBefore"]).timestamp()


def _publish(fake: FakeMetadata, cloud: str, kind: str = "default") -> tuple:
    """Publishes a notice; returns ``(expected deadline or None, approx, when set)``.

    ``approx`` is the tolerance on the deadline (GCE's preempted deadline is
    computed by the watcher from the time it saw the notice).
    """
    now = time.time()
    if cloud == "aws":
        action = aws_action("terminate", 120.0)
        fake.aws_instance_action = action
        return _aws_deadline(action), 1e-6, time.monotonic()
    if cloud == "azure":
        event = azure_event("Preempt", ("vm0",), 30.0)
        fake.azure_events = [event]
        return _azure_deadline(event), 1e-6, time.monotonic()
    if kind == "preempted":
        fake.gce_preempted = "TRUE"
        return now + 30.0, 1.5, time.monotonic()
    fake.gce_maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
    return None, 0.0, time.monotonic()


NOTICE_CASES = [
    ("gce", "maintenance"),
    ("gce", "preempted"),
    ("aws", "default"),
    ("azure", "default"),
]


# Backstop above its own bounds in sequence: the first poll, the notice (+ 30 s).
@pytest.mark.timeout(2 * SEEN_WITHIN + 30)
@pytest.mark.parametrize(("cloud", "kind"), NOTICE_CASES)
def test_notice_is_seen_with_its_deadline(fake, watches, cloud, kind):
    w = watches(cloud, fake)
    _polled(w)
    assert _notice(w, 0) is None
    expected, approx, published = _publish(fake, cloud, kind)
    notice = _notice(w, SEEN_WITHIN)
    seen_after = time.monotonic() - published
    assert notice is not None
    assert seen_after < SEEN_WITHIN, f"seen {seen_after:.3f}s after it appeared"
    description, deadline = notice
    assert isinstance(description, str) and description
    if expected is None:
        assert deadline is None
    else:
        assert deadline == pytest.approx(expected, abs=approx)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_notice_is_posted_into_the_inbox(fake, watches, cloud):
    inbox = _native.Inbox()
    try:
        watches(cloud, fake, inbox)
        assert inbox.recv(0.6) is None
        expected, approx, published = _publish(fake, cloud)
        item = inbox.recv(SEEN_WITHIN)
        assert time.monotonic() - published < SEEN_WITHIN
        assert isinstance(item, _native.Inbox.Input.Notice), item
        assert isinstance(item.source, str) and item.source
        if expected is None:
            assert item.deadline is None
        else:
            assert item.deadline == pytest.approx(expected, abs=approx)
        assert item.kill == item.deadline, "a cloud's announced end is the kill"
    finally:
        inbox.post(_native.Inbox.Input.Stop())


@pytest.mark.timeout(30)
def test_gce_long_polls_with_the_etag(fake, watches):
    w = watches("gce", fake)
    _until(
        lambda: any(f"last_etag={etag('NONE')}" in p for _, p, _ in fake.requests),
        "a long poll with the ETag",
    )
    assert _notice(w, QUIET) is None
    polls = [p for _, p, _ in fake.requests if "wait_for_change=true" in p]
    assert polls, fake.requests
    assert all(h.get("metadata-flavor") == "Google" for _, _, h in fake.requests)
    # Long polls: a plain GET and a long poll per endpoint, not a request every interval.
    assert len(fake.requests) <= 6, fake.requests


# Backstop above its own bounds in sequence: two request waits, the token, the notice
# (+ 30 s).
@pytest.mark.timeout(2 * REQUESTS_WITHIN + TOKENS_WITHIN + SEEN_WITHIN + 30)
def test_aws_uses_an_imdsv2_token_and_renews_it_on_401(fake, watches):
    w = watches("aws", fake)
    assert fake.wait_for_requests(AWS_INSTANCE_ACTION, 2, REQUESTS_WITHIN)
    requests = fake.requests
    assert requests[0][:2] == ("PUT", AWS_TOKEN)
    assert requests[0][2]["x-aws-ec2-metadata-token-ttl-seconds"].isdigit()
    (token,) = fake.aws_tokens
    gets = [h for m, p, h in requests if m == "GET"]
    assert gets and all(h.get("x-aws-ec2-metadata-token") == token for h in gets)
    fake.revoke_aws_tokens()
    assert fake.wait_for_requests(AWS_TOKEN, 2, REQUESTS_WITHIN, method="PUT")
    renewed_tokens = fake.wait_for_aws_tokens(TOKENS_WITHIN)
    assert renewed_tokens, (
        f"no IMDSv2 token was made again after the 401 (waited {TOKENS_WITHIN:g} s)"
    )
    (renewed,) = renewed_tokens
    assert renewed != token
    _, _, published = _publish(fake, "aws")
    assert _notice(w, SEEN_WITHIN) is not None
    assert time.monotonic() - published < SEEN_WITHIN
    last = [h for m, p, h in fake.requests if p == AWS_INSTANCE_ACTION][-1]
    assert last["x-aws-ec2-metadata-token"] == renewed


# Backstop above its own bounds in sequence: the first request, the notice (+ 30 s).
@pytest.mark.timeout(2 * SEEN_WITHIN + 30)
def test_aws_falls_back_to_imdsv1(fake, watches):
    fake.aws_imdsv1 = True
    w = watches("aws", fake)
    assert fake.wait_for_requests(AWS_INSTANCE_ACTION, 1, SEEN_WITHIN)
    assert _notice(w, 0) is None
    gets = [h for m, p, h in fake.requests if p == AWS_INSTANCE_ACTION]
    assert gets and all("x-aws-ec2-metadata-token" not in h for h in gets)
    deadline, _, published = _publish(fake, "aws")
    notice = _notice(w, SEEN_WITHIN)
    assert notice is not None and notice[1] == deadline
    assert time.monotonic() - published < SEEN_WITHIN


@pytest.mark.timeout(30)
def test_aws_rebalance_is_not_a_notice(fake, watches, caplog):
    w = watches("aws", fake)
    doc = aws_rebalance_notice(0)
    fake.aws_rebalance = doc
    seen = f"(noticeTime {_aws_deadline({'time': doc['noticeTime']}):.0f} Unix seconds)"
    _until(
        lambda: any("AWS recommends rebalancing" in m and seen in m for m in caplog.messages),
        "the rebalance recommendation's warning",
    )
    assert _notice(w, QUIET) is None


# Backstop above its own bounds in sequence: the request wait, a 0.1 s wait (+ 30 s).
@pytest.mark.timeout(REQUESTS_WITHIN + 0.1 + 30)
@pytest.mark.parametrize(
    "events",
    [
        [azure_event("Preempt", ("vm1",))],
        [azure_event("Terminate", ("other-vm", "vm00"))],
        [azure_event("Reboot", ("vm0",))],
        [azure_event("Redeploy", ("vm0",))],
        [azure_event("Freeze", ("vm0",))],
        [azure_event("Reboot", ("vm0",)), azure_event("Preempt", ("vm1",))],
    ],
    ids=["preempt-other", "terminate-others", "reboot", "redeploy", "freeze", "mixed"],
)
def test_azure_events_that_do_not_terminate_this_vm(fake, watches, events, caplog):
    fake.azure_events = events
    w = watches("azure", fake, interval=0.1)
    assert fake.wait_for_requests(AZURE_EVENTS, 4, REQUESTS_WITHIN)
    assert _notice(w, 0.1) is None
    assert _warnings(caplog, "request failed") == _warnings(caplog, "unexpected answer") == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("event_type", ["Preempt", "Terminate"])
def test_azure_terminating_event_for_this_vm(fake, watches, event_type):
    fake.azure_vm_name = "trainer-7"
    w = watches("azure", fake)
    event = azure_event(event_type, ("trainer-1", "trainer-7"), 45.0)
    fake.azure_events = [azure_event("Reboot", ("trainer-7",)), event]
    notice = _notice(w, SEEN_WITHIN)
    assert notice is not None
    assert notice[1] == pytest.approx(_azure_deadline(event), abs=1e-6)


@pytest.mark.timeout(30)
def test_azure_empty_not_before_means_now(fake, watches):
    w = watches("azure", fake)
    assert _notice(w, 0.6) is None
    fake.azure_events = [azure_event("Preempt", ("vm0",), not_before_in=None)]
    notice = _notice(w, SEEN_WITHIN)
    assert notice is not None
    assert notice[1] == pytest.approx(time.time(), abs=2.0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_close_is_prompt_and_idempotent(fake, watches, cloud):
    w = watches(cloud, fake)
    assert _notice(w, 0.3) is None
    start = time.monotonic()
    w.close()
    w.close()
    assert time.monotonic() - start < SEEN_WITHIN / 2, "close is prompt"
    asked = len(fake.requests)
    _publish(fake, cloud)
    assert _notice(w, QUIET) is None, "a closed watch posts nothing"
    assert len(fake.requests) == asked, "a closed watch polls no more"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("ibm", "http://127.0.0.1:1"), {}),
        (("aws", "https://127.0.0.1:1"), {}),
        (("aws", "not a url"), {}),
        (("aws", "http://127.0.0.1:1"), {"interval": 0}),
        (("aws", "http://127.0.0.1:1"), {"interval": float("nan")}),
        (("aws", "http://127.0.0.1:1"), {"request_timeout": -1}),
    ],
)
def test_bad_arguments_are_value_errors(args, kwargs):
    with pytest.raises(ValueError):
        _native.MetadataWatch(*args, **kwargs)


# ------------------------------------------------------------ hostile servers


# Backstop above its own bounds in sequence: the polls, the notice, two close() of 2 s
# each (+ 30 s).
@pytest.mark.timeout(2 * SEEN_WITHIN + 2 * 2 + 30)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_hostile_server(fake, watches, cloud, fault, caplog):
    """No exception, no false notice, prompt close(); polling survives the fault."""
    fake.fault = fault
    w = watches(cloud, fake, **FAULT_TIMING)
    doomed = watches(cloud, fake, **FAULT_TIMING)  # closed while the fault is on
    # 200s with bodies that do not parse are "malformed"; the rest are failed requests.
    kind = "unexpected answer" if fault in ("garbage", "hostile_json") else "request failed"
    _polled(w, requests=4)  # two of each watch at least
    _until(lambda: _warnings(caplog, kind), f"a warning: {kind}")
    assert _notice(w, 0) is None, "a false notice"
    doomed.close()  # returns while a request hangs (a hang would fail the test)
    fake.fault = None
    expected, approx, _ = _publish(fake, cloud)
    notice = _notice(w, SEEN_WITHIN)
    assert notice is not None, f"polling did not survive {fault!r}: {fake.requests}"
    if expected is not None:
        assert notice[1] == pytest.approx(expected, abs=approx)
    w.close()


# ------------------------------------------------------------ a cloud's probe


@pytest.mark.parametrize("cloud", CLOUDS)
def test_probe_finds_each_cloud(fake, cloud):
    assert _probe(cloud)(fake.base, 1.0) is True


def test_probe_aws_imdsv1(fake):
    fake.aws_imdsv1 = True
    assert _probe("aws")(fake.base) is True


@pytest.mark.parametrize("cloud", CLOUDS)
def test_probe_false_with_nothing_listening(cloud):
    start = time.monotonic()
    assert _probe(cloud)(f"http://127.0.0.1:{_free_port()}", 1.0) is False
    assert time.monotonic() - start < SEEN_WITHIN


@pytest.mark.parametrize("cloud", CLOUDS)
def test_probe_false_for_a_server_error(fake, cloud):
    fake.set(fault="500", fault_scope="all")
    assert _probe(cloud)(fake.base, 1.0) is False
    assert fake.requests


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_probe_is_bounded_by_its_timeout(fake, cloud):
    fake.set(fault="hang", fault_scope="all")
    start = time.monotonic()
    assert _probe(cloud)(fake.base, 0.5) is False
    elapsed = time.monotonic() - start
    # A probe that ignored its timeout would wait for the hung server: a hang.
    assert 0.4 < elapsed < SEEN_WITHIN, f"probe took {elapsed:.3f}s with a 0.5s timeout"
