"""Platform detection and defaults, against fake metadata servers on 127.0.0.1.

Nothing here addresses anything but 127.0.0.1: the GCE host is the session's
closed port (conftest) or a fake server, and the AWS/Azure default bases and the
DMI tables are redirected for every test (``_isolated_environment``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import http.server
import signal
import socket
import threading
import time
import warnings

import pytest
from fake_metadata import FakeMetadata, aws_action
from tf_failure_handling import TerminationConfig, testing
from tf_failure_handling._platforms import clouds, kubernetes, slurm
from tf_failure_handling._platforms import common as shared
from tf_failure_handling._platforms import platform as _platform

from .conftest import HANG, NO_METADATA_SERVER, wait_for_attention

PD = _platform.PlatformDevice
HOSTNAME = "/computeMetadata/v1/instance/hostname"
MAINTENANCE = "/computeMetadata/v1/instance/maintenance-event"
#: The variables these tests set; a developer's own values must not leak in.
ENV_VARS = (
    _platform.CLOUD_ENV,
    clouds.AWS.variable,
    clouds.AZURE.variable,
    kubernetes.GRACE_ENV,
    slurm.END_TIME_ENV,
    "SLURM_JOB_ID",
    "KUBERNETES_SERVICE_HOST",
)
#: A probe of an unreachable metadata service gives up within this: a bound that only
#: turns a probe without a timeout (one that waits for a server that never answers)
#: into a failure; how fast it gives up is a bench figure.
PROBE_BOUND = 15.0


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


#: The metadata requests' timeout while the fake server answers. The core's (1 s,
#: ``METADATA_TIMEOUT`` in src/sources/shared.rs) is far above a local answer on an idle
#: machine, but under ``make test``'s load a probe of an answering server gave up before
#: the answer (a ``BrokenPipeError`` on the server's side, and GCE not detected): the
#: load, not the code, decided. So the ``metadata`` fixture's requests are given this
#: timeout (:func:`_patient_probe`); the tests of a server that never answers put the
#: core's back (``PRODUCTION_PROBE``): they measure it.
ANSWERING_TIMEOUT = 60.0
#: Each cloud's probe as the core's table gives it (its row's ``probe``).
PRODUCTION_PROBES = {c.NAME: c.probe for c in clouds.CLOUDS}


def PRODUCTION_PROBE(cloud, base, timeout=None, **kwargs):
    """The core's probe of ``cloud``."""
    return PRODUCTION_PROBES[cloud](base, timeout, **kwargs)


def _patient_probe(cloud, base, timeout=None, **kwargs):
    """The core's probe with :data:`ANSWERING_TIMEOUT` where the package leaves the
    timeout to the core."""
    patient = ANSWERING_TIMEOUT if timeout is None else timeout
    return PRODUCTION_PROBE(cloud, base, patient, **kwargs)


def _use_probe(monkeypatch, probe) -> None:
    """Every cloud probes with ``probe(cloud, base, ...)`` (in place of its row's)."""
    for cloud in clouds.CLOUDS:
        monkeypatch.setattr(cloud, "probe", functools.partial(probe, cloud.NAME))


@pytest.fixture
def metadata(monkeypatch):
    server = FakeMetadataServer()
    monkeypatch.setenv("GCE_METADATA_IP", server.address)
    _use_probe(monkeypatch, _patient_probe)
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


@pytest.fixture(autouse=True)
def logical_devices(monkeypatch):
    """The kinds of TF logical device this process has (``{"GPU"}``, ...), the input
    of the device mapping; none unless a test adds some, whatever the host has."""
    present: set = set()
    monkeypatch.setattr(_platform, "_devices", lambda kind: kind in present)
    return present


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch, tmp_path):
    """No cloud, no scheduler: empty DMI tables, metadata bases on a closed port."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    sysfs = tmp_path / "sys"
    dmi = sysfs / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    monkeypatch.setattr(clouds, "SYSFS", str(sysfs))
    closed = "http://" + NO_METADATA_SERVER
    monkeypatch.setattr(clouds.AWS, "default_base", closed)
    monkeypatch.setattr(clouds.AZURE, "default_base", closed)
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()
    yield dmi
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()


@pytest.fixture
def dmi(_isolated_environment):
    """Writes DMI table entries: ``dmi(sys_vendor="Amazon EC2", ...)``."""

    def write(**entries: str) -> None:
        for name, value in entries.items():
            (_isolated_environment / name).write_text(value + "\n")

    return write


@pytest.fixture
def fake():
    """The three-cloud fake metadata server (tests/fake_metadata.py)."""
    with FakeMetadata() as server:
        yield server


# ------------------------------------------------------------ complete()


def _env(cloud=None, device=None, scheduler=None, base=None) -> _platform.Environment:
    if device is None:
        device = PD.GCE_CPU if cloud == "gce" else PD.INTERNAL_CPU
    if base is None and cloud is not None:
        base = "http://127.0.0.1:1"
    return _platform.Environment(
        device=device, cloud=cloud, metadata_base=base, scheduler=scheduler
    )


def _exit_code(exit_fn) -> int:
    with pytest.raises(SystemExit) as exc:
        exit_fn()
    return exc.value.code


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


# (cloud, device, exit code, grace period): the defaults table of _platform.complete.
DEFAULTS_TABLE = [
    (None, PD.INTERNAL_CPU, 42, 0),
    (None, PD.INTERNAL_GPU, 42, 0),
    (None, PD.INTERNAL_TPU, 42, 0),
    (None, PD.UNSUPPORTED, 42, 0),
    ("gce", PD.GCE_GPU, 143, 3600),
    ("gce", PD.GCE_CPU, 143, 0),
    ("gce", PD.GCE_TPU, 143, 0),
    ("aws", PD.INTERNAL_CPU, 42, 120),
    ("aws", PD.INTERNAL_GPU, 42, 120),
    ("azure", PD.INTERNAL_CPU, 42, 30),
    ("azure", PD.INTERNAL_GPU, 42, 30),
]


@pytest.mark.parametrize(("cloud", "device", "code", "grace"), DEFAULTS_TABLE)
def test_defaults_table(cloud, device, code, grace):
    d = _platform.complete(_env(cloud, device), None, None, None, None)
    assert isinstance(d, _platform.Defaults)
    assert d.watcher_fn is None, "metadata services are watched natively, not by a watcher fn"
    assert _exit_code(d.exit_fn) == code
    assert d.exit_fn is (clouds.GCE.exit_fn if cloud == "gce" else shared.default_exit_fn)
    assert d.grace_period == grace
    assert d.signals == (signal.SIGTERM,)


@pytest.mark.parametrize(("cloud", "device", "code", "grace"), DEFAULTS_TABLE)
@pytest.mark.parametrize("given", [0, 0.0, 5, 7200.5])
def test_a_given_grace_period_wins_including_zero(cloud, device, code, grace, given):
    d = _platform.complete(_env(cloud, device), None, None, given, None)
    assert d.grace_period == given
    assert type(d.grace_period) is type(given)


@pytest.mark.parametrize(("cloud", "device", "code", "grace"), DEFAULTS_TABLE)
def test_what_the_user_gave_wins(cloud, device, code, grace):
    def watcher():
        return False

    def exit_fn():
        return None

    d = _platform.complete(
        _env(cloud, device, scheduler="slurm"), watcher, exit_fn, 12, [signal.SIGUSR2]
    )
    assert d == _platform.Defaults(watcher, exit_fn, 12, (signal.SIGUSR2,))


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        (None, (signal.SIGTERM,)),
        ("kubernetes", (signal.SIGTERM,)),
        ("slurm", (signal.SIGTERM, signal.SIGUSR1)),
    ],
)
def test_default_signals_follow_the_scheduler(scheduler, expected):
    assert _platform.complete(_env(scheduler=scheduler), None, None, None, None).signals == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((), ()),
        ([], ()),
        ([signal.SIGINT], (signal.SIGINT,)),
        ((signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1), (signal.SIGUSR1, signal.SIGTERM)),
    ],
)
def test_given_signals_are_kept_as_plain_ints(given, expected):
    signals = _platform.complete(_env(scheduler="slurm"), None, None, None, given).signals
    assert signals == expected
    assert all(type(s) is int for s in signals)


def test_defaults_are_frozen():
    d = _platform.complete(_env(), None, None, None, None)
    with pytest.raises(AttributeError):
        d.grace_period = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        _env().cloud = "aws"  # type: ignore[misc]


# ------------------------------------------------------------ metadata server


def test_default_metadata_host(monkeypatch):
    monkeypatch.delenv("GCE_METADATA_IP", raising=False)
    assert clouds.gce_base() == "http://metadata.google.internal"
    monkeypatch.setenv("GCE_METADATA_IP", "10.1.2.3:8080")
    assert clouds.gce_base() == "http://10.1.2.3:8080"


def test_on_gce_when_hostname_answers_with_the_header(metadata):
    assert clouds.on_gce() is True
    path, headers = metadata.requests[-1]
    assert path == HOSTNAME
    assert headers.get("Metadata-Flavor") == "Google"


@pytest.mark.parametrize("status", [403, 404, 500, 503])
def test_not_on_gce_when_hostname_fails(metadata, status):
    metadata.routes[HOSTNAME] = (status, b"no")
    assert clouds.on_gce() is False
    assert metadata.requests, "the server was not asked"


def test_not_on_gce_without_a_server(monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", NO_METADATA_SERVER)
    start = time.monotonic()
    assert clouds.on_gce() is False
    assert time.monotonic() - start < PROBE_BOUND


@pytest.mark.timeout(20)
def test_on_gce_is_bounded_when_the_server_never_answers(metadata, monkeypatch):
    _use_probe(monkeypatch, PRODUCTION_PROBE)
    metadata.hang = True
    start = time.monotonic()
    assert clouds.on_gce() is False
    assert time.monotonic() - start < PROBE_BOUND
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
    assert clouds.termination_watcher() is expected
    path, headers = metadata.requests[-1]
    assert path == MAINTENANCE
    assert headers.get("Metadata-Flavor") == "Google"


@pytest.mark.parametrize("status", [404, 500, 503])
def test_termination_watcher_is_false_on_http_errors(metadata, status):
    metadata.routes[MAINTENANCE] = (status, b"TERMINATE_ON_HOST_MAINTENANCE")
    assert clouds.termination_watcher() is False


# Regression test for a bug these unit tests found (fixed; formerly a strict xfail).
@pytest.mark.parametrize("fn", ["on_gce", "termination_watcher"])
def test_http_error_responses_are_closed(metadata, fn):
    metadata.routes[HOSTNAME] = metadata.routes[MAINTENANCE] = (503, b"busy")
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        assert getattr(clouds, fn)() is False
        gc.collect()
    assert metadata.requests
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


@pytest.mark.timeout(20)
def test_termination_watcher_is_bounded_when_the_server_never_answers(metadata, monkeypatch):
    _use_probe(monkeypatch, PRODUCTION_PROBE)
    metadata.hang = True
    start = time.monotonic()
    assert clouds.termination_watcher() is False
    assert time.monotonic() - start < PROBE_BOUND


def test_termination_watcher_without_a_server(monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", NO_METADATA_SERVER)
    assert clouds.termination_watcher() is False


# Regression tests: an endpoint that does not speak HTTP once made these raise
# http.client.BadStatusLine instead of returning False.
@pytest.mark.timeout(20)
def test_on_gce_is_false_when_the_endpoint_is_not_http(garbage_server):
    assert clouds.on_gce() is False


@pytest.mark.timeout(20)
def test_termination_watcher_is_false_when_the_endpoint_is_not_http(garbage_server):
    assert clouds.termination_watcher() is False


# ------------------------------------------------------------ environment()


# (TF logical devices present, on GCE, the PlatformDevice's value): TF's
# failure_handling_util.detect_platform (TF 2.21), written out, not computed: a GPU
# wins over a TPU, the prefix says GCE or not, and no GPU or TPU is a CPU.
DEVICE_TABLE = [
    ((), False, "internal_CPU"),
    ((), True, "GCE_CPU"),
    (("CPU",), False, "internal_CPU"),
    (("CPU",), True, "GCE_CPU"),
    (("GPU",), False, "internal_GPU"),
    (("GPU",), True, "GCE_GPU"),
    (("TPU",), False, "internal_TPU"),
    (("TPU",), True, "GCE_TPU"),
    (("GPU", "TPU"), False, "internal_GPU"),
    (("GPU", "TPU"), True, "GCE_GPU"),
    (("CPU", "TPU"), True, "GCE_TPU"),
]


@pytest.mark.parametrize(("present", "gce", "expected"), DEVICE_TABLE)
def test_device_table(request, logical_devices, present, gce, expected):
    logical_devices.update(present)
    if gce:
        request.getfixturevalue("metadata")
    env = _platform.environment()
    assert env.cloud == ("gce" if gce else None)
    assert env.device.value == expected
    assert _platform.detect().value == expected


def test_off_cloud_without_any_probe_takes_milliseconds(fake, monkeypatch):
    """No variables, no DMI tables: only the GCE probe (TF's), which fails at once here.

    A correctness bound, not a benchmark: an AWS or Azure probe would be a request
    to the fake server (the default bases point there) and an unreachable one costs
    up to the core's METADATA_TIMEOUT.
    """
    monkeypatch.setattr(clouds.AWS, "default_base", fake.base)
    monkeypatch.setattr(clouds.AZURE, "default_base", fake.base)
    _platform.environment()  # warm up imports and the probe thread's first start
    _platform.environment.cache_clear()
    env = _platform.environment()
    assert (env.device, env.cloud, env.metadata_base, env.scheduler) == (PD("internal_CPU"),) + (
        None,
    ) * 3
    assert fake.requests == [], "probed a metadata service without a reason to"


@pytest.mark.parametrize("cloud", ["gce", "aws", "azure", "none", "AWS", " azure "])
def test_forced_cloud_is_not_probed(fake, monkeypatch, cloud):
    for name, value in {**fake.env("gce"), **fake.env("aws"), **fake.env("azure")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(_platform.CLOUD_ENV, cloud)
    env = _platform.environment()
    want = cloud.strip().lower()
    assert env.cloud == (None if want == "none" else want)
    assert env.metadata_base == (None if want == "none" else fake.base)
    assert env.device.value == ("GCE_CPU" if want == "gce" else "internal_CPU")
    assert fake.requests == []


def test_forced_cloud_without_variables_uses_the_default_bases(monkeypatch):
    monkeypatch.setenv(_platform.CLOUD_ENV, "aws")
    assert _platform.environment().metadata_base == clouds.AWS.default_base
    _platform.environment.cache_clear()
    monkeypatch.setenv(_platform.CLOUD_ENV, "azure")
    assert _platform.environment().metadata_base == clouds.AZURE.default_base
    _platform.environment.cache_clear()
    monkeypatch.delenv(clouds.GCE.variable)
    monkeypatch.setenv(_platform.CLOUD_ENV, "gce")
    assert _platform.environment().metadata_base == "http://metadata.google.internal"


@pytest.mark.parametrize("value", ["ec2", "google", "1", "gce,aws"])
def test_unknown_forced_cloud_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(_platform.CLOUD_ENV, value)
    with pytest.raises(ValueError, match=_platform.CLOUD_ENV):
        _platform.environment()


def test_gce_detected_by_its_metadata_server(fake, monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", fake.host)
    env = _platform.environment()
    assert env.cloud == "gce"
    assert env.metadata_base == fake.base
    assert env.device.value == "GCE_CPU"
    method, path, headers = fake.requests[0]
    assert (method, path, headers["metadata-flavor"]) == ("GET", HOSTNAME, "Google")


def test_aws_detected_through_the_variable(fake, monkeypatch):
    monkeypatch.setenv(clouds.AWS.variable, fake.base + "/")
    env = _platform.environment()
    assert (env.cloud, env.metadata_base) == ("aws", fake.base)
    assert env.device.value == "internal_CPU"
    assert any(path.startswith("/latest/") for _, path, _ in fake.requests)


def test_azure_detected_through_the_variable(fake, monkeypatch):
    monkeypatch.setenv(clouds.AZURE.variable, fake.base)
    env = _platform.environment()
    assert (env.cloud, env.metadata_base) == ("azure", fake.base)
    assert any(path.startswith("/metadata/") for _, path, _ in fake.requests)


def test_detection_order_is_gce_aws_azure(fake, monkeypatch):
    for cloud in ("azure", "aws", "gce"):
        for name, value in fake.env(cloud).items():
            monkeypatch.setenv(name, value)
        _platform.environment.cache_clear()
        assert _platform.environment().cloud == cloud


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_a_variable_pointing_at_another_service_is_not_that_cloud(monkeypatch, cloud):
    """The probe checks the answer: a GCE-only server (404 elsewhere) is not AWS or Azure."""
    server = FakeMetadataServer()
    try:
        name = clouds.AWS.variable if cloud == "aws" else clouds.AZURE.variable
        monkeypatch.setenv(name, "http://" + server.address)
        assert _platform.environment().cloud is None
    finally:
        server.stop()


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_unreachable_variable_base_is_not_that_cloud_and_bounded(monkeypatch, cloud):
    name = clouds.AWS.variable if cloud == "aws" else clouds.AZURE.variable
    monkeypatch.setenv(name, "http://" + NO_METADATA_SERVER)
    start = time.monotonic()
    assert _platform.environment().cloud is None
    assert time.monotonic() - start < PROBE_BOUND


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_a_server_error_is_not_that_cloud(fake, monkeypatch, cloud):
    fake.set(fault="500", fault_scope="all")
    for name, value in fake.env(cloud).items():
        monkeypatch.setenv(name, value)
    assert _platform.environment().cloud is None
    assert fake.requests


# DMI tables as the kernel shows them on each kind of machine.
AWS_DMI = [
    {"sys_vendor": "Amazon EC2", "product_name": "m5.large", "bios_vendor": "Amazon EC2"},
    {"board_vendor": "Amazon EC2"},
    {"bios_vendor": "Xen", "bios_version": "4.11.amazon", "product_name": "HVM domU"},
    {"product_name": "amazon-something"},
]
AZURE_DMI = [
    {"chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77"},
    {"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"},
]
OTHER_DMI = [
    {},
    {"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"},
    {"sys_vendor": "Google", "product_name": "Google Compute Engine"},
    {"sys_vendor": "Microsoft Corporation", "product_name": "Surface Laptop"},
    {"sys_vendor": "Dell Inc.", "product_name": "PowerEdge R750", "chassis_asset_tag": "1234"},
    {"sys_vendor": "Xen", "bios_version": "4.2"},
]


def _named(cloud: str, fake) -> bool:
    """Whether the lines below ``clouds.SYSFS`` name ``cloud``'s machines: then the core
    probes its metadata service (the fake answers as every cloud), else it makes no
    request and says no."""
    return PRODUCTION_PROBE(cloud, fake.base, ANSWERING_TIMEOUT, sysfs=clouds.SYSFS)


@pytest.mark.parametrize("entries", AWS_DMI + AZURE_DMI + OTHER_DMI)
def test_dmi_classification(dmi, fake, entries):
    dmi(**entries)
    assert _named("aws", fake) is (entries in AWS_DMI)
    assert _named("azure", fake) is (entries in AZURE_DMI)


@pytest.mark.parametrize(
    ("uuid", "on_aws"),
    [("ec2e1916-9099-7caf-fd21-012345abcdef", True), ("EC2E1916-9099", True), ("4c4c4544", False)],
)
def test_xen_hypervisor_uuid(monkeypatch, tmp_path, fake, uuid, on_aws):
    path = tmp_path / "sys" / "hypervisor" / "uuid"  # below the fixture's sysfs
    path.parent.mkdir()
    path.write_text(uuid + "\n")
    assert _named("aws", fake) is on_aws


def test_unreadable_dmi_is_no_cloud(monkeypatch, tmp_path, fake):
    monkeypatch.setattr(clouds, "SYSFS", str(tmp_path / "missing"))
    (tmp_path / "missing" / "hypervisor" / "uuid").mkdir(parents=True)  # reading it fails
    assert _named("aws", fake) is False
    assert _named("azure", fake) is False
    assert fake.requests == [], "probed a cloud its machine lines do not name"


@pytest.mark.parametrize(
    ("cloud", "entries"), [("aws", e) for e in AWS_DMI] + [("azure", e) for e in AZURE_DMI]
)
def test_dmi_makes_the_default_base_probed(fake, monkeypatch, dmi, cloud, entries):
    dmi(**entries)
    named = {"aws": clouds.AWS, "azure": clouds.AZURE}[cloud]
    monkeypatch.setattr(named, "default_base", fake.base)
    env = _platform.environment()
    assert (env.cloud, env.metadata_base) == (cloud, fake.base)


@pytest.mark.parametrize("entries", AWS_DMI[:1] + AZURE_DMI[:1])
def test_dmi_hit_with_an_unreachable_base_is_not_that_cloud_and_bounded(dmi, entries):
    dmi(**entries)  # the default bases are a closed port (fixture)
    start = time.monotonic()
    assert _platform.environment().cloud is None
    assert time.monotonic() - start < PROBE_BOUND


@pytest.mark.parametrize("entries", OTHER_DMI)
def test_no_probe_without_dmi_or_variable(fake, monkeypatch, dmi, entries):
    dmi(**entries)
    monkeypatch.setattr(clouds.AWS, "default_base", fake.base)
    monkeypatch.setattr(clouds.AZURE, "default_base", fake.base)
    assert _platform.environment().cloud is None
    assert fake.requests == []


def test_a_probe_that_raises_is_not_that_cloud(monkeypatch, dmi):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    _use_probe(monkeypatch, broken)
    dmi(sys_vendor="Amazon EC2")
    monkeypatch.setenv(clouds.AZURE.variable, "http://" + NO_METADATA_SERVER)
    assert _platform.environment().cloud is None


def test_probe_gets_the_cloud_and_base_and_leaves_the_timeout_to_the_core(monkeypatch, dmi):
    calls = []
    _use_probe(monkeypatch, lambda *a, **kw: calls.append((*a, kw)) or a[0] == "azure")
    dmi(sys_vendor="Amazon EC2")
    monkeypatch.setenv(clouds.AZURE.variable, "127.0.0.1:9")
    env = _platform.environment()
    assert (env.cloud, env.metadata_base) == ("azure", "http://127.0.0.1:9")
    # GCE first, through the same native probe (one detection per platform); no
    # timeout: the core's METADATA_TIMEOUT (the bounded tests above measure it). A
    # cloud without its variable is probed only where the machine's sysfs lines name
    # it: the core reads them (GCE's row names none: always; here its variable is set).
    gce_sysfs = None if clouds.GCE.check() is not None else clouds.SYSFS
    assert calls == [
        ("gce", clouds.gce_base(), {"sysfs": gce_sysfs}),
        ("aws", clouds.AWS.default_base, {"sysfs": clouds.SYSFS}),
        ("azure", "http://127.0.0.1:9", {"sysfs": None}),
    ]


def test_environment_is_computed_once(fake, monkeypatch):
    monkeypatch.setenv("GCE_METADATA_IP", fake.host)
    first = _platform.environment()
    asked = len(fake.requests)
    fake.set(fault="500", fault_scope="all")
    assert _platform.environment() is first
    assert _platform.detect() is first.device
    assert len(fake.requests) == asked, "environment() asked the server again"
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()
    assert _platform.environment().cloud is None
    assert _platform.detect().value == "internal_CPU"


# ------------------------------------------------------------ scheduler


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, None),
        ({"SLURM_JOB_ID": "1234"}, "slurm"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubernetes"),
        ({"SLURM_JOB_ID": "1234", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "slurm"),
        ({"SLURM_JOB_ID": "", "KUBERNETES_SERVICE_HOST": ""}, None),
    ],
)
def test_scheduler(monkeypatch, variables, expected):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert _platform.environment().scheduler == expected


# ------------------------------------------------------------ signal_deadlines()

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("end", "expected"),
    [(NOW + 600, NOW + 600), (NOW + 0.5, NOW + 0.5), (NOW - 1, None), (NOW, None), (None, None)],
)
def test_slurm_deadline_is_the_job_end_time_if_in_the_future(end, expected):
    # Parsing SLURM_JOB_END_TIME (and rejecting bad values at construction) is
    # tested in test_environment_validation.py.
    env = dataclasses.replace(_env(scheduler="slurm"), settings={"slurm": end})
    # Nothing read of the job (no KillWait): no kill is stated.
    assert _platform.signal_deadlines(env, NOW) == (expected, None)


@pytest.mark.parametrize("grace", [30.0, 45.0, 0.0, 2.5])
def test_kubernetes_deadline_is_now_plus_the_grace_period(grace):
    """A stated grace period is both the deadline and the kill."""
    env = dataclasses.replace(_env(scheduler="kubernetes"), settings={"kubernetes": grace})
    assert _platform.signal_deadlines(env, NOW) == (NOW + grace, NOW + grace)


def test_kubernetes_without_the_grace_period_plans_for_the_default_and_states_no_kill():
    """Unset, the pod's grace period is an assumption: the saves are planned for
    Kubernetes' default, and nothing says when SIGKILL comes (no exit guard)."""
    env = dataclasses.replace(_env(scheduler="kubernetes"), settings={"kubernetes": None})
    assert _platform.signal_deadlines(env, NOW) == (NOW + 30.0, None)


@pytest.mark.parametrize("cloud", [None, "gce", "aws", "azure"])
def test_no_signal_deadline_without_a_scheduler(monkeypatch, cloud):
    monkeypatch.setenv(slurm.END_TIME_ENV, str(int(NOW) + 600))
    monkeypatch.setenv(kubernetes.GRACE_ENV, "45")
    assert _platform.signal_deadlines(_env(cloud), NOW) == (None, None)


# ------------------------------------------------------------ detect() and the handler


def test_detect_without_gce():
    assert _platform.detect().value == "internal_CPU"


def test_detect_on_gce(metadata):
    assert _platform.detect().value == "GCE_CPU"


# Backstop above its own bound: the wait for the notice, HANG (+ 30 s).
@pytest.mark.timeout(HANG + 30)
def test_handler_on_gce_exits_with_gces_code_on_a_maintenance_event(
    fake, monkeypatch, make_handler, tmp_path
):
    """End to end: maintenance event on the fake server -> save -> SystemExit(143)."""
    monkeypatch.setenv("GCE_METADATA_IP", fake.host)
    w = testing.FakeVariable(0)
    ckpt = testing.FakeCheckpoint(w=w)
    h = make_handler(ckpt, tmp_path / "ckpt")
    assert h._environment.cloud == "gce"
    assert h._platform_device.value == "GCE_CPU"
    assert h._termination_watcher_fn is None
    assert h._exit_fn is clouds.GCE.exit_fn
    for _ in range(3):
        h.run(lambda: w.assign_add(1))
    assert h._attention is False
    fake.gce_maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
    wait_for_attention(h)
    with pytest.raises(SystemExit) as exc:
        for _ in range(5):
            h.run(lambda: w.assign_add(1))
    assert exc.value.code == 143
    assert ckpt.checkpointed_runs.numpy() == h._run_counter
    assert fake.count(MAINTENANCE) > 0


# Backstop above its own bound: the wait for the notice, HANG (+ 30 s).
@pytest.mark.timeout(HANG + 30)
def test_handler_on_aws_gets_the_spot_defaults(fake, monkeypatch, make_handler, tmp_path):
    monkeypatch.setenv(clouds.AWS.variable, fake.base)
    h = make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    assert h._environment.cloud == "aws"
    assert h._exit_fn is shared.default_exit_fn
    assert h._grace_period == 120  # Spot's two minutes
    fake.aws_instance_action = aws_action("terminate", in_seconds=120)
    wait_for_attention(h)


def test_handler_keeps_a_user_exit_fn_and_grace(metadata, make_handler, tmp_path):
    def exit_fn():
        return None

    def watcher():
        return False

    h = make_handler(
        testing.FakeCheckpoint(w=testing.FakeVariable(0)),
        tmp_path / "ckpt",
        TerminationConfig(exit_fn=exit_fn, grace_period=0, termination_watcher_fn=watcher),
    )
    assert h._environment.cloud == "gce"
    assert h._exit_fn is exit_fn
    assert h._grace_period == 0
    assert h._termination_watcher_fn is watcher


def test_handler_off_cloud_has_borg_defaults(make_handler, tmp_path):
    h = make_handler(testing.FakeCheckpoint(w=testing.FakeVariable(0)), tmp_path / "ckpt")
    assert h._platform_device.value == "internal_CPU"
    assert h._environment.cloud is None
    assert h._termination_watcher_fn is None
    assert h._exit_fn is shared.default_exit_fn
    assert h._grace_period == 0
    assert tuple(h._driver.sources.signals) == (signal.SIGTERM,)
