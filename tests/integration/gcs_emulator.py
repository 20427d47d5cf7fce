"""TensorFlow's own GCS filesystem (``tf.io.gfile`` on ``gs://``) against a local emulator.

TensorFlow's GCS client has no endpoint override: it talks HTTPS to the fixed hosts
``www.googleapis.com`` (JSON API and uploads) and ``storage.googleapis.com`` (media
reads). :func:`gcs_emulator` gives it those hosts without the internet:

* a network namespace ``tffh-gcs-<pid>-<n>`` with only ``lo`` up (nothing in it can
  reach anything outside this machine);
* ``/etc/netns/<name>/hosts``, which ``ip netns exec`` bind-mounts over ``/etc/hosts``
  for the commands it runs, mapping both hosts to 127.0.0.1 inside the namespace only
  (the machine's own ``/etc/hosts`` is not touched);
* a throwaway CA and a server certificate for both names (``openssl``, in a temporary
  directory), handed to TensorFlow's curl with ``CURL_CA_BUNDLE``;
* ``gcp-storage-emulator`` (PyPI, pinned in the Makefile), run by this file's
  ``__main__`` inside the namespace on 127.0.0.1:443 with TLS, one bucket created;
* ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` so TensorFlow asks no metadata server for a token.

Everything is removed on exit, also when setting up or the test fails: the emulator
process, the namespace, ``/etc/netns/<name>`` and the temporary directory.

Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), ``ip`` and ``openssl``. Where one is
missing, or ``gcp_storage_emulator`` is not installed, the fixture skips with the
reason, except under ``CI=true`` where it fails (tests/ci.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path

HOSTS = ("www.googleapis.com", "storage.googleapis.com")
PORT = 443
READY_LINE = "GCS-EMULATOR-READY"
_IDS = itertools.count()
_SETUP_TIMEOUT = 30.0
#: Bound on one openssl run: an RSA key's prime search takes a random time, which a
#: loaded host stretches (a fresh-clone make test saw one run over 30 s).
OPENSSL_BOUND = 120.0
#: Bound on one emulator client call (``list_objects``, ``read_object``).
CLIENT_BOUND = 60.0
#: The bounded steps of one :func:`gcs_emulator` life, for a test's pytest-timeout: the
#: set-up (listing stale namespaces, 30 s; 3 openssl runs; 2 ip runs of 30 s each; the ready
#: wait) and the teardown (the emulator's stop, 2 x 10 s; 2 ip runs of 30 s). Stale
#: namespaces of killed runs, 2 ip runs each, are not counted.
LIFETIME_BOUND = 30.0 + 3 * OPENSSL_BOUND + 2 * 30.0 + _SETUP_TIMEOUT + 2 * 10.0 + 2 * 30.0

# TensorFlow's GCS defaults retry 10 times from 1 s up to 32 s and wait up to 120 s to
# connect: against a local emulator a failure should show in seconds, not minutes.
TF_GCS_ENV = {
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator-token",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "500000",
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "5",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "30",
    "GCS_METADATA_REQUEST_TIMEOUT_SECS": "30",
    "GCS_READ_REQUEST_TIMEOUT_SECS": "60",
    "GCS_WRITE_REQUEST_TIMEOUT_SECS": "60",
}


class GcsEmulatorUnavailable(RuntimeError):
    """This machine cannot host the emulator (the message says what is missing)."""


class GcsEmulatorError(RuntimeError):
    """The emulator was set up but did not come up: a bug, never a reason to skip."""


def unavailable_reason() -> str | None:
    """None if :func:`gcs_emulator` can run here, else what is missing."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (platform {sys.platform})"
    for tool in ("ip", "openssl"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command is not installed"
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError as e:
        return (
            f"gcp-storage-emulator is not installed in {sys.executable} ({e}); "
            "`make` installs it (Makefile DEPS)"
        )
    if os.geteuid() != 0:
        return "creating a network namespace and /etc/netns/<name>/hosts needs root"
    return None


def _run(cmd: Sequence[str], what: str, timeout: float = 30.0) -> str:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise GcsEmulatorUnavailable(f"{what}: `{' '.join(cmd)}` ran over {timeout} s") from e
    if proc.returncode != 0:
        raise GcsEmulatorUnavailable(
            f"{what}: `{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout


def _make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for :data:`HOSTS`; returns (ca, cert, key)."""
    ca_key, ca = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "server.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(f'DNS:{h}' for h in HOSTS)}\n"
    )
    what = "making the emulator's TLS certificates"
    _run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=tf-failure-handling test CA", "-keyout", str(ca_key), "-out", str(ca)],
        what,
        OPENSSL_BOUND,
    )  # fmt: skip
    _run(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={HOSTS[0]}",
         "-keyout", str(key), "-out", str(csr)],
        what,
        OPENSSL_BOUND,
    )  # fmt: skip
    _run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert)],
        what,
        OPENSSL_BOUND,
    )  # fmt: skip
    return ca, cert, key


class GcsEmulator:
    """What :func:`gcs_emulator` yields: a running emulator and a way into its namespace."""

    def __init__(self, namespace: str, bucket: str, env: dict, workdir: Path):
        self.namespace = namespace
        self.bucket = bucket
        #: The variables a process needs to use the emulator (merged by run/popen).
        self.env = env
        self.workdir = workdir
        self.log_path = workdir / "emulator.log"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside the namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def _env(self, env: dict | None) -> dict:
        merged = dict(os.environ)
        merged.update(self.env)
        if env:
            merged.update(env)
        return merged

    def run(
        self, argv: Sequence[str], env: dict | None = None, timeout: float = 120.0, **kwargs
    ) -> subprocess.CompletedProcess:
        """Runs ``argv`` in the namespace with :attr:`env` (+ ``env``), output captured.

        Raises ``subprocess.TimeoutExpired`` (the child killed) past ``timeout`` seconds.
        """
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv), env=self._env(env), timeout=timeout, **kwargs)

    def popen(self, argv: Sequence[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Starts ``argv`` in the namespace with :attr:`env` (+ ``env``); the caller waits."""
        return subprocess.Popen(self.command(argv), env=self._env(env), **kwargs)

    def _client(self, op: str, *args: str, timeout: float = CLIENT_BOUND) -> str:
        argv = [sys.executable, str(Path(__file__).resolve()), "client", op, self.bucket, *args]
        try:
            proc = self.run(argv, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(
                f"emulator client `{op} {' '.join(args)}` ran over {timeout} s (waiting for "
                f"the emulator's answer); emulator log:\n{self.log_tail()}"
            ) from e
        if proc.returncode != 0:
            raise RuntimeError(
                f"emulator client `{op} {' '.join(args)}` exited {proc.returncode}: "
                f"{proc.stderr.strip()[-2000:]}"
            )
        return proc.stdout

    def list_objects(self, prefix: str = "") -> list[str]:
        """Names of the bucket's objects under ``prefix``, asked over the JSON API."""
        return json.loads(self._client("list", prefix))

    def read_object(self, name: str) -> bytes:
        """The bytes of object ``name``, read over HTTPS from inside the namespace."""
        return bytes.fromhex(self._client("read", name).strip())

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _wait_ready(proc: subprocess.Popen, timeout: float) -> None:
    """Waits (at most ``timeout`` s) for the emulator's ready line on its stdout."""
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GcsEmulatorError(
                    f"the GCS emulator did not print {READY_LINE!r} within {timeout} s "
                    f"(waiting for it to listen on 127.0.0.1:{PORT}); it printed: {seen[-2000:]!r}"
                )
            if not sel.select(min(left, 0.5)):
                if proc.poll() is not None:
                    raise GcsEmulatorError(
                        f"the GCS emulator exited {proc.returncode} before listening: "
                        f"{seen[-2000:]!r}"
                    )
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait(timeout=5)
                raise GcsEmulatorError(
                    f"the GCS emulator exited {proc.returncode} before listening: {seen[-2000:]!r}"
                )
            seen += chunk
            if READY_LINE.encode() in seen:
                return
    finally:
        sel.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _remove_stale(namespace_prefix: str = "tffh-gcs-") -> None:
    """Removes what a killed earlier run left: namespaces of processes that are gone."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    live = {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}
    names = set(live)
    with contextlib.suppress(OSError):
        names |= set(os.listdir("/etc/netns"))
    for name in sorted(names):
        parts = name[len(namespace_prefix) :].split("-")
        if not name.startswith(namespace_prefix) or not parts[0].isdigit():
            continue
        if Path(f"/proc/{parts[0]}").exists():
            continue  # its owner still runs (or the pid was reused): leave it
        if name in live:
            _kill_namespace_processes(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILLs what is still running in the namespace (a test's leftover ``popen``)."""
    proc = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    )
    for pid in proc.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def gcs_emulator(bucket: str = "test-bucket") -> Iterator[GcsEmulator]:
    """Sets up namespace, hosts file, certificates and emulator; removes them all on exit.

    Raises :class:`GcsEmulatorUnavailable` when this machine cannot host it (see
    :func:`require_gcs_emulator` for the skip-or-fail policy) and
    :class:`GcsEmulatorError` when the emulator does not start (within
    ``_SETUP_TIMEOUT`` seconds).
    """
    reason = unavailable_reason()
    if reason is not None:
        raise GcsEmulatorUnavailable(reason)
    _remove_stale()
    namespace = f"tffh-gcs-{os.getpid()}-{next(_IDS)}"
    netns_etc = Path("/etc/netns") / namespace
    workdir = Path(tempfile.mkdtemp(prefix="tffh-gcs-"))
    proc: subprocess.Popen | None = None
    log = None
    made_netns = False
    try:
        ca, cert, key = _make_certificates(workdir)
        netns_etc.mkdir(parents=True, exist_ok=True)
        (netns_etc / "hosts").write_text(
            "127.0.0.1\tlocalhost\n" + "".join(f"127.0.0.1\t{h}\n" for h in HOSTS)
        )
        _run(["ip", "netns", "add", namespace], "creating the network namespace")
        made_netns = True
        _run(
            ["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"],
            "bringing lo up in the network namespace",
        )
        env = {"CURL_CA_BUNDLE": str(ca), **TF_GCS_ENV}
        emu = GcsEmulator(namespace, bucket, env, workdir)
        log = open(emu.log_path, "wb")  # closed in finally
        proc = emu.popen(
            [sys.executable, str(Path(__file__).resolve()), "serve", bucket, str(cert), str(key)],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        _wait_ready(proc, _SETUP_TIMEOUT)
        yield emu
    finally:
        if proc is not None:
            _stop(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        if log is not None:
            log.close()
        if made_netns:
            _kill_namespace_processes(namespace)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        shutil.rmtree(netns_etc, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def require_gcs_emulator(bucket: str = "test-bucket") -> Iterator[GcsEmulator]:
    """:func:`gcs_emulator` for a pytest fixture: skips where this machine cannot host it,
    fails instead under ``CI=true``; an emulator that does not start always fails.

    Use::

        @pytest.fixture(scope="module")
        def gcs():
            with require_gcs_emulator() as emu:
                yield emu
    """
    import pytest
    from ci import is_ci

    try:
        cm = gcs_emulator(bucket)
        emu = cm.__enter__()
    except GcsEmulatorUnavailable as e:
        message = f"GCS emulator unavailable: {e}"
        if is_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)
    with contextlib.ExitStack() as stack:
        stack.push(cm)
        yield emu


# --- run inside the namespace (``python gcs_emulator.py serve|client ...``) ---


def _serve(bucket: str, cert: str, key: str) -> None:
    """Serves the emulator with TLS on 127.0.0.1:443 until terminated."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    httpd = make_server(bucket, cert, key)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(READY_LINE, flush=True)
    httpd.serve_forever()


def make_server(
    bucket: str,
    cert: str,
    key: str,
    *,
    address: tuple = ("127.0.0.1", PORT),
    threaded: bool = False,
    on_body=None,
):
    """The emulator's HTTPS server on ``address``, with ``bucket`` created (in memory),
    not yet serving; ``httpd.storage`` is its storage.

    ``threaded``: one thread per connection (concurrent uploads proceed side by side;
    the default serves one request at a time). ``on_body(method, path, nbytes)`` is
    called with the size of every request body read (after de-chunking).
    """
    import ssl
    from functools import partial
    from http.server import HTTPServer, ThreadingHTTPServer

    from gcp_storage_emulator import server as emulator_server
    from gcp_storage_emulator.handlers.buckets import create_bucket
    from gcp_storage_emulator.storage import Storage

    def read_raw_data(request_handler):
        # The emulator's own reader joins chunks with `bytes +=`: quadratic, hours for a
        # 256 MB upload. Same framing, read in linear time.
        length = request_handler.headers.get("Content-Length")
        if length:
            raw = request_handler.rfile.read(int(length))
        elif "chunked" in (request_handler.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                line = request_handler.rfile.readline().strip()
                size = int(line.split(b";")[0], 16) if line else 0
                if size == 0:
                    break
                parts.append(request_handler.rfile.read(size))
                request_handler.rfile.readline()
            raw = b"".join(parts)
        else:
            return None
        if on_body is not None:
            on_body(request_handler.command, request_handler.path, len(raw))
        return raw

    emulator_server._read_raw_data = read_raw_data

    class HttpsRequest(emulator_server.Request):
        # The emulator builds resumable-upload Locations and media links from
        # http://<Host>; TensorFlow follows the Location, so it must say https.
        def __init__(self, request_handler, method):
            super().__init__(request_handler, method)
            self._base_url = "https" + self._base_url[len("http") :]
            self._full_url = "https" + self._full_url[len("http") :]
            self._parsed_url = urllib.parse.urlparse(self._full_url)

        @property
        def data(self):
            # TensorFlow's makedirs uploads the empty directory marker "d/" with
            # uploadType=media and no body; the emulator takes the missing body for
            # None and fails on len(None).
            data = super().data
            if data is None and self.query.get("uploadType") == ["media"]:
                return b""
            return data

    emulator_server.Request = HttpsRequest

    class Handler(emulator_server.RequestHandler):
        def parse_request(self):
            if not super().parse_request():
                return False
            # TensorFlow's curl sends uploads chunked *and* with a Content-Length; the
            # emulator reads Content-Length bytes of the chunked framing ("5\r\nhe").
            # HTTP says Transfer-Encoding wins (RFC 9112 6.3).
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                del self.headers["Content-Length"]
            # curl waits 1 s for "100 Continue" before sending a body; http.server
            # answers Expect only on HTTP/1.1, and the emulator speaks HTTP/1.0.
            if self.headers.get("Expect", "").lower() == "100-continue":
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.wfile.flush()
            return True

    storage = Storage(use_memory_fs=True)
    create_bucket(bucket, storage)
    server_class = ThreadingHTTPServer if threaded else HTTPServer
    httpd = server_class(address, partial(Handler, storage))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.storage = storage
    return httpd


def _client(op: str, bucket: str, arg: str) -> None:
    """Asks the emulator over HTTPS (as TensorFlow would) from inside the namespace."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=os.environ["CURL_CA_BUNDLE"])
    quoted = urllib.parse.quote(arg, safe="")
    if op == "list":
        names: list[str] = []
        token = None
        while True:
            query = {"prefix": arg} | ({"pageToken": token} if token else {})
            url = f"https://{HOSTS[0]}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
            with urllib.request.urlopen(url, context=context, timeout=20) as r:
                page = json.load(r)
            names += [item["name"] for item in page.get("items") or []]
            token = page.get("nextPageToken")
            if not token:
                break
        print(json.dumps(sorted(names)))
    elif op == "read":
        url = f"https://{HOSTS[1]}/{bucket}/{quoted}"
        with urllib.request.urlopen(url, context=context, timeout=20) as r:
            print(r.read().hex())
    else:
        raise SystemExit(f"unknown client op {op!r}")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve(*sys.argv[2:5])
    elif sys.argv[1] == "client":
        _client(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        raise SystemExit(f"usage: {sys.argv[0]} serve BUCKET CERT KEY | client OP BUCKET [ARG]")
