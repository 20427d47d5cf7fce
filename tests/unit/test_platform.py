"""Platform detection and defaults, against a fake GCE metadata server on 127.0.0.1."""

from __future__ import annotations

import gc
import http.server
import socket
import threading
import time
import warnings

import pytest
from tf_failure_handling import TerminationConfig, _platform, testing

from .conftest import NO_METADATA_SERVER, wait_for_attention

PD = _platform.PlatformDevice
HOSTNAME = "/computeMetadata/v1/instance/hostname"
MAINTENANCE = "/computeMetadata/v1/instance/maintenance-event"


class FakeMetadataServer:
    """GCE's metadata server as TF and the package use it.

    ``routes`` maps a path to ``(status, body)``; requests without the header
    ``Metadata-Flavor: Google`` get 403, as from the real server. ``hang`` makes
    every request wait (without answering) until the server stops.
    """

    def __init__(self) -> None:
        self.routes: dict = {HOSTNAME: (200, b"vm-1.c.project.internal")}
        self.requests: list = []
        self.hang = False
        self.stopping = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests.append((self.path, dict(self.headers)))
                if owner.hang:
                    owner.stopping.wait(10)
                    return
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, b"Missing Metadata-Flavor:Google header.")
                    return
                status, body = owner.routes.get(self.path.split("?")[0], (404, b"not found"))
                self._reply(status, body)

            def _reply(self, status, body):
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def metadata(monkeypatch):
    server = FakeMetadataServer()
    monkeypatch.setenv("GCE_METADATA_IP", server.address)
    _platform.detect.cache_clear()
    yield server
    _platform.detect.cache_clear()
    server.stop()
    _collect_leaked_sockets()


def _collect_leaked_sockets():
    """Collects sockets the package leaks on HTTP errors, silently: this is reported by
    test_http_error_responses_are_closed, and must not fail whichever test runs next."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def garbage_server(monkeypatch):
    """A TCP server that answers every connection with bytes that are not HTTP."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                    conn.sendall(b"\x00\x01garbage, not HTTP at all\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{sock.getsockname()[1]}")
    _platform.detect.cache_clear()
    yield
    _platform.detect.cache_clear()
    stop.set()
    t.join(5)
    sock.close()
    _collect_leaked_sockets()


@pytest.fixture
def clean_detect():
    _platform.detect.cache_clear()
    yield
    _platform.detect.cache_clear()


def _expected_device(gce: bool) -> PD:
    if _platform._devices("GPU"):
        return PD.GCE_GPU if gce else PD.INTERNAL_GPU
    if _platform._devices("TPU"):
        return PD.GCE_TPU if gce else PD.INTERNAL_TPU
    return PD.GCE_CPU if gce else PD.INTERNAL_CPU


# ------------------------------------------------------------ complete()


def test_platform_device_values_are_tfs():
    assert {d.name: d.value for d in PD} == {
        "INTERNAL_CPU": "internal_CPU",
        "INTERNAL_GPU": "internal_GPU",
        "INTERNAL_TPU": "internal_TPU",
        "GCE_GPU": "GCE_GPU",
        "GCE_TPU": "GCE_TPU",
        "GCE_CPU": "GCE_CPU",
        "UNSUPPORTED": "unsupported",
    }


@pytest.mark.parametrize(
    "device", [PD.INTERNAL_CPU, PD.INTERNAL_GPU, PD.INTERNAL_TPU, PD.UNSUPPORTED]
)
def test_internal_defaults(device):
    watcher, exit_fn, grace = _platform.complete(device, None, None, None)
    assert watcher is None
    assert grace == 0
    with pytest.raises(SystemExit) as exc:
        exit_fn()
    assert exc.value.code == 42


@pytest.mark.parametrize("device", [PD.INTERNAL_CPU, PD.INTERNAL_GPU, PD.INTERNAL_TPU])
def test_internal_keeps_what_the_user_gave(device):
    def watcher():
        return False

    def exit_fn():
        return None

    assert _platform.complete(device, watcher, exit_fn, 12) == (watcher, exit_fn, 12)


def test_gce_gpu_defaults():
    watcher, exit_fn, grace = _platform.complete(PD.GCE_GPU, None, None, None)
    assert watcher is _platform.gce_termination_watcher
    assert grace == 3600
    with pytest.raises(SystemExit) as exc:
        exit_fn()
    assert exc.value.code == 143


@pytest.mark.parametrize("grace", [0, 0.0, 5, 7200.5])
def test_gce_gpu_honours_a_given_grace_period_including_zero(grace):
    assert _platform.complete(PD.GCE_GPU, None, None, grace)[2] == grace


@pytest.mark.parametrize("device", [PD.GCE_CPU, PD.GCE_TPU])
def test_gce_cpu_and_tpu_defaults(device):
    watcher, exit_fn, grace = _platform.complete(device, None, None, None)
    assert watcher is _platform.gce_termination_watcher
    assert grace == 0
    with pytest.raises(SystemExit) as exc:
        exit_fn()
    assert exc.value.code == 143


@pytest.mark.parametrize("device", [PD.GCE_CPU, PD.GCE_TPU, PD.GCE_GPU])
def test_gce_keeps_what_the_user_gave(device):
    def watcher():
        return False

    def exit_fn():
        return None

    assert _platform.complete(device, watcher, exit_fn, 30) == (watcher, exit_fn, 30)


# ------------------------------------------------------------ metadata server


def test_default_metadata_host(monkeypatch):
    monkeypatch.delenv("GCE_METADATA_IP", raising=False)
    assert _platform._gce_base() == "http://metadata.google.internal"
    monkeypatch.setenv("GCE_METADATA_IP", "10.1.2.3:8080")
    assert _platform._gce_base() == "http://10.1.2.3:8080"


def test_on_gce_when_hostname_answers_with_the_header(metadata):
    assert _platform.on_gce() is True
    path, headers = metadata.requests[-1]
    assert path == HOSTNAME
    assert headers.get("Metadata-Flavor") == "Google"


@pytest.mark.parametrize("status", [403, 404, 500, 503])
def test_not_on_gce_when_hostname_fails(metadata, status):
    metadata.routes[HOSTNAME] = (status, b"no")
    assert _platform.on_gce() is False
    assert metadata.requests, "the server was not asked"


def test_not_on_gce_without_a_server(monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", NO_METADATA_SERVER)
    start = time.monotonic()
    assert _platform.on_gce() is False
    assert time.monotonic() - start < 1.5


@pytest.mark.timeout(20)
def test_on_gce_is_bounded_when_the_server_never_answers(metadata):
    metadata.hang = True
    start = time.monotonic()
    assert _platform.on_gce() is False
    assert time.monotonic() - start < 1.5
    assert metadata.requests


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"TERMINATE_ON_HOST_MAINTENANCE", True),
        (b"NONE", False),
        (b"MIGRATE_ON_HOST_MAINTENANCE", False),
        (b"terminate_on_host_maintenance", False),
        (b"", False),
        (b"\xff\xfe\x00garbage", False),
    ],
)
def test_termination_watcher_reads_maintenance_event(metadata, body, expected):
    metadata.routes[MAINTENANCE] = (200, body)
    assert _platform.gce_termination_watcher() is expected
    path, headers = metadata.requests[-1]
    assert path == MAINTENANCE
    assert headers.get("Metadata-Flavor") == "Google"


@pytest.mark.parametrize("status", [404, 500, 503])
def test_termination_watcher_is_false_on_http_errors(metadata, status):
    metadata.routes[MAINTENANCE] = (status, b"TERMINATE_ON_HOST_MAINTENANCE")
    assert _platform.gce_termination_watcher() is False


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
@pytest.mark.parametrize("fn", ["on_gce", "gce_termination_watcher"])
def test_http_error_responses_are_closed(metadata, fn):
    metadata.routes[HOSTNAME] = metadata.routes[MAINTENANCE] = (503, b"busy")
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        assert getattr(_platform, fn)() is False
        gc.collect()
    assert metadata.requests
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


@pytest.mark.timeout(20)
def test_termination_watcher_is_bounded_when_the_server_never_answers(metadata):
    metadata.hang = True
    start = time.monotonic()
    assert _platform.gce_termination_watcher() is False
    assert time.monotonic() - start < 1.5


def test_termination_watcher_without_a_server(monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", NO_METADATA_SERVER)
    assert _platform.gce_termination_watcher() is False


# Regression tests: an endpoint that does not speak HTTP once made these raise
# http.client.BadStatusLine instead of returning False.
@pytest.mark.timeout(20)
def test_on_gce_is_false_when_the_endpoint_is_not_http(garbage_server):
    assert _platform.on_gce() is False


@pytest.mark.timeout(20)
def test_termination_watcher_is_false_when_the_endpoint_is_not_http(garbage_server):
    assert _platform.gce_termination_watcher() is False


# ------------------------------------------------------------ detect()


def test_detect_without_gce(clean_detect, monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", NO_METADATA_SERVER)
    assert _platform.detect() is _expected_device(gce=False)


def test_detect_on_gce(metadata):
    assert _platform.detect() is _expected_device(gce=True)


def test_detect_is_computed_once(metadata):
    first = _platform.detect()
    asked = len(metadata.requests)
    metadata.routes[HOSTNAME] = (500, b"gone")
    assert _platform.detect() is first
    assert len(metadata.requests) == asked, "detect() asked the server again"
    _platform.detect.cache_clear()
    assert _platform.detect() is _expected_device(gce=False)


def test_handler_on_gce_uses_the_gce_watcher_and_exit_code(metadata, make_handler, tmp_path):
    """End to end: maintenance event on the fake server -> save -> SystemExit(143)."""
    metadata.routes[MAINTENANCE] = (200, b"NONE")
    w = testing.FakeVariable(0)
    ckpt = testing.FakeCheckpoint(w=w)
    h = make_handler(ckpt, tmp_path / "ckpt")
    assert h._platform_device in (PD.GCE_CPU, PD.GCE_GPU, PD.GCE_TPU)
    assert h._termination_watcher_fn is _platform.gce_termination_watcher
    assert h._exit_fn is _platform.gce_exit_fn
    for _ in range(3):
        h.run(lambda: w.assign_add(1))
    assert h._attention is False
    metadata.routes[MAINTENANCE] = (200, b"TERMINATE_ON_HOST_MAINTENANCE")
    wait_for_attention(h, timeout=5)
    with pytest.raises(SystemExit) as exc:
        for _ in range(5):
            h.run(lambda: w.assign_add(1))
    assert exc.value.code == 143
    assert ckpt.checkpointed_runs.numpy() == h._run_counter
    assert any(path == MAINTENANCE for path, _ in metadata.requests)


def test_handler_on_gce_keeps_a_user_exit_fn_and_grace(metadata, make_handler, tmp_path):
    def exit_fn():
        return None

    h = make_handler(
        testing.FakeCheckpoint(w=testing.FakeVariable(0)),
        tmp_path / "ckpt",
        TerminationConfig(exit_fn=exit_fn, grace_period=0, termination_watcher_fn=lambda: False),
    )
    assert h._exit_fn is exit_fn
    assert h._grace_period == 0
    assert h._termination_watcher_fn is not _platform.gce_termination_watcher


def test_handler_off_gce_has_borg_defaults(clean_detect, make_handler, tmp_path, monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", NO_METADATA_SERVER)
    h = make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    assert h._platform_device is _expected_device(gce=False)
    assert h._termination_watcher_fn is None
    assert h._exit_fn is _platform.default_exit_fn
    assert h._grace_period == 0
