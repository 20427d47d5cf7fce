"""What one preemption save writes to the checkpoint's storage, and how long it takes
when that storage's bandwidth is limited: TensorFlow's handler and ours.

Under MultiWorkerMirroredStrategy every worker saves on a preemption: the chief to the
checkpoint folder, each non-chief (TensorFlow's design) a full copy to
``dirname(ckpt)/workertemp_<task_id>/`` on the same storage, deleted before it exits.
This bench runs N MWMS worker processes (the integration tests' ``mwms_worker.py``,
plus ``--model-mb`` of float32 variables created under ``strategy.scope()`` and saved
with the model), the checkpoint on ``gs://``, sends SIGTERM to worker 1 once every
worker has trained 10 steps, and waits for every worker to save and exit 42. In turn
with TF's handler, ours in its default mode (``memory``: a non-chief's copy in
TensorFlow's ``ram://``) and ours with ``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares``
(every worker writes a share of the one checkpoint, one part of TensorFlow's sharded
layout in the chief's folder, and the chief merges them), ``--repeats`` times for each
worker count and each limit.

The storage is the GCS emulator of ``tests/integration/gcs_emulator.py`` (TensorFlow's
own ``gs://`` file system, HTTPS to ``www.googleapis.com``), here one thread per
connection, in a network namespace of its own. The bench builds a small network of
namespaces it owns (removed on exit, also on failure; nothing else is touched):

* a hub namespace with a bridge; the storage namespace (10.213.0.100) and one
  namespace per worker (10.213.0.1, .2, ...) each joined to it by a veth pair. The
  workers reach each other on their own addresses (TF_CONFIG), and the storage through
  ``/etc/netns/<name>/hosts``, which maps the GCS host names to 10.213.0.100 inside
  the worker namespaces only.
* **per-writer limit**: on each worker's veth, an htb class with rate = ceil =
  ``--rate-mbps`` for the packets to 10.213.0.100 (the workers' own traffic, the
  initial broadcast of the variables included, is not limited): N writers can write N
  x the rate together, as when each VM has its own NIC and the bucket scales.
* **shared limit**: a ``tbf`` of ``--rate-mbps`` on the hub's port to the storage
  namespace: all writers share one link in front of the storage (one NIC, one
  gateway, a bucket's ingress quota), where N copies cost N x the time of one.

Bytes are measured on the storage side: the emulator reads every request body itself
(de-chunked) and logs its size with the time (``make_server``'s ``on_body``); a run's
figure is the sum of the bodies received after the SIGTERM, i.e. every upload of that
save (the chief's checkpoint, each non-chief's copy or share, the small index and
``checkpoint`` files; a merge's renames are copies in the server: no body). The bytes
the storage namespace's veth received in the same window (``ip -s link``: headers, TLS
and TCP acknowledgments included) are printed per run as a cross-check. Time: from the
SIGTERM to the last ``save`` event (the end of the last ``CheckpointManager.save``) and
to the last worker's ``exit`` event (after the non-chiefs deleted their copies), both
``time.time()`` on this machine.

After each run the bench lists the bucket and checks that the checkpoint is whole: in
the chief's folder, the ``checkpoint`` file, the last checkpoint's ``.index`` and its
data files ``.data-0000i-of-0000k`` for every i < k (k = 1, or N with ``shares``),
together at least the model's bytes; no ``workertemp_*`` copy and no ``*_temp`` part
left in the bucket.

The workers get the bench's environment, with ``TF_FAILURE_HANDLING_NON_CHIEF_SAVES``
set for ours: ``memory`` (the default), or ``shares``.

Needs root, ``ip``, ``tc``, ``openssl`` and gcp-storage-emulator, as the emulator does.
Prints medians, the ratios ours/TF and shares/TF (below 1: ours writes less, or is
faster) and the command line.

    python benches/bench_save_copies.py [--workers 2,4] [--model-mb 256]
        [--rate-mbps 200] [--repeats 1] [--limits per-writer,shared] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(TESTS))

BUCKET = "bench-bucket"
SUBNET = "10.213.0"
STORAGE_IP = f"{SUBNET}.100"
#: The port every worker's gRPC server listens on, each in its own namespace.
WORKER_PORT = 23456
NAMESPACE_PREFIX = "tffh-bsc-"
STEPS = 100_000  # never reached: the run ends with the preemption
STEP_SLEEP = 0.03
NOTICE_AFTER = 10
#: One ballast variable holds at most this many MiB (a few variables, as a model has).
VARIABLE_MIB = 32
#: Bound on the start of a cluster (TF imports, the variables' broadcast) up to step 10;
#: `make test`'s load can make 4 TF workers take minutes.
STARTUP_BOUND = 420.0
#: Bound on one `ip`/`tc` call and on the emulator's start.
COMMAND_BOUND = 30.0
LIMITS = ("per-writer", "shared")
#: The variants, each run in turn: the handler (``mwms_worker.py --impl``) and, for ours,
#: ``TF_FAILURE_HANDLING_NON_CHIEF_SAVES``.
NON_CHIEF_SAVES_ENV = "TF_FAILURE_HANDLING_NON_CHIEF_SAVES"
VARIANTS = {"tf": ("tf", None), "ours": ("ours", "memory"), "shares": ("ours", "shares")}
QUICK = {"workers": "2", "model_mb": 16, "rate_mbps": 100.0, "repeats": 1}
DEFAULTS = {"workers": "2,4", "model_mb": 256, "rate_mbps": 200.0, "repeats": 1}


def run(cmd: list, what: str, check: bool = True) -> str:
    """Runs ``cmd`` (bounded by :data:`COMMAND_BOUND`); raises with ``what`` on failure."""
    try:
        proc = subprocess.run(
            [str(c) for c in cmd], capture_output=True, text=True, timeout=COMMAND_BOUND
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{what}: `{' '.join(map(str, cmd))}` ran over {COMMAND_BOUND} s") from e
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{what}: `{' '.join(map(str, cmd))}` exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout


def worker_ip(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


# --- the network of namespaces --------------------------------------------------------


@dataclass
class Network:
    hub: str
    storage: str
    workers: list


@contextlib.contextmanager
def network(num_workers: int):
    """The hub, storage and worker namespaces (module docstring); all removed on exit."""
    from integration.gcs_emulator import HOSTS, _kill_namespace_processes, _remove_stale

    _remove_stale(NAMESPACE_PREFIX)  # what a killed earlier run left
    prefix = f"{NAMESPACE_PREFIX}{os.getpid()}"
    net = Network(f"{prefix}-hub", f"{prefix}-s", [f"{prefix}-w{i}" for i in range(num_workers)])
    made: list = []
    etc: list = []
    try:
        run(["ip", "netns", "add", net.hub], "creating the hub namespace")
        made.append(net.hub)
        run(["ip", "-n", net.hub, "link", "add", "br0", "type", "bridge"], "adding the bridge")
        run(["ip", "-n", net.hub, "link", "set", "br0", "up"], "bringing the bridge up")
        ends = [(net.storage, STORAGE_IP, "s0")]
        ends += [(ns, worker_ip(i), f"w{i}") for i, ns in enumerate(net.workers)]
        for ns, address, port in ends:
            folder = Path("/etc/netns") / ns
            folder.mkdir(parents=True, exist_ok=True)
            etc.append(folder)
            (folder / "hosts").write_text(
                "127.0.0.1\tlocalhost\n" + "".join(f"{STORAGE_IP}\t{h}\n" for h in HOSTS)
            )
            run(["ip", "netns", "add", ns], f"creating namespace {ns}")
            made.append(ns)
            run(
                ["ip", "-n", net.hub, "link", "add", port, "type", "veth",
                 "peer", "name", "eth0", "netns", ns],
                f"adding the veth pair of {ns}",
            )  # fmt: skip
            run(["ip", "-n", net.hub, "link", "set", port, "master", "br0", "up"], "a bridge port")
            run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"], "an address")
            run(["ip", "-n", ns, "link", "set", "eth0", "up"], f"bringing eth0 of {ns} up")
            run(["ip", "-n", ns, "link", "set", "lo", "up"], f"bringing lo of {ns} up")
        yield net
    finally:
        for ns in reversed(made):
            with contextlib.suppress(Exception):
                _kill_namespace_processes(ns)
            run(["ip", "netns", "del", ns], f"deleting namespace {ns}", check=False)
        for folder in etc:
            shutil.rmtree(folder, ignore_errors=True)


def set_limit(net: Network, limit: str, rate_mbps: float) -> None:
    """Puts the ``limit`` shaping in place (and removes the other's)."""
    rate = f"{rate_mbps:g}mbit"
    run(["tc", "-n", net.hub, "qdisc", "del", "dev", "s0", "root"], "clearing", check=False)
    for ns in net.workers:
        run(["tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"], "clearing", check=False)
    if limit == "shared":
        run(
            ["tc", "-n", net.hub, "qdisc", "add", "dev", "s0", "root", "tbf", "rate", rate,
             "burst", "256kb", "latency", "50ms"],
            "limiting the storage's link",
        )  # fmt: skip
        return
    for ns in net.workers:
        what = f"limiting the writes of {ns}"
        tc = ["tc", "-n", ns]
        run([*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20"],
            what)  # fmt: skip
        run([*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb",
             "rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k"], what)  # fmt: skip
        run([*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb",
             "rate", "10gbit"], what)  # fmt: skip
        run([*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32",
             "match", "ip", "dst", f"{STORAGE_IP}/32", "flowid", "1:10"], what)  # fmt: skip


def storage_rx_bytes(net: Network) -> int:
    """Bytes the storage namespace's veth has received."""
    out = run(["ip", "-n", net.storage, "-s", "-j", "link", "show", "eth0"], "reading rx")
    return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


# --- the storage ------------------------------------------------------------------------


@dataclass
class Storage:
    proc: subprocess.Popen
    env: dict
    log: Path

    def bodies(self, since: float) -> int:
        """Bytes of the request bodies the emulator received after ``since``."""
        total = 0
        with open(self.log) as f:
            for line in f:
                if line.endswith("\n"):
                    record = json.loads(line)
                    if record["t"] >= since:
                        total += record["bytes"]
        return total

    def list(self, net: Network, prefix: str) -> dict:
        """``{name: size}`` of the bucket's objects under ``prefix`` (the JSON API, from
        the storage namespace)."""
        env = {**os.environ, **self.env}
        cmd = ["ip", "netns", "exec", net.storage, sys.executable, __file__, "_list", BUCKET,
               prefix]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"listing gs://{BUCKET}/{prefix} ran over 120 s") from e
        if proc.returncode != 0:
            raise RuntimeError(f"listing gs://{BUCKET}/{prefix}: {proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout)

    def wipe(self) -> None:
        """Empties the bucket (the emulator keeps objects in memory)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)


@contextlib.contextmanager
def storage(net: Network, workdir: Path, write_bound: float):
    """The emulator in the storage namespace, on 10.213.0.100:443; stopped on exit."""
    from integration.gcs_emulator import TF_GCS_ENV, _make_certificates, _stop, _wait_ready

    ca, cert, key = _make_certificates(workdir)
    log = workdir / "bodies.jsonl"
    log.touch()
    env = {
        **TF_GCS_ENV,
        "CURL_CA_BUNDLE": str(ca),
        # One upload at the shared limit, behind N-1 others, takes N x its own time.
        "GCS_WRITE_REQUEST_TIMEOUT_SECS": str(int(write_bound)),
    }
    with open(workdir / "emulator.log", "wb") as err:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", net.storage, sys.executable, __file__, "_serve",
             BUCKET, cert, key, log],
            stdout=subprocess.PIPE,
            stderr=err,
        )  # fmt: skip
    try:
        _wait_ready(proc, COMMAND_BOUND)
        yield Storage(proc, env, log)
    finally:
        _stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def serve(bucket: str, cert: str, key: str, log_path: str) -> None:
    """Inside the storage namespace: the emulator, threaded, logging each body's size;
    SIGUSR1 empties the bucket."""
    from integration.gcs_emulator import PORT, READY_LINE, make_server

    lock = threading.Lock()
    log = open(log_path, "a")  # open until the process ends

    def on_body(method: str, path: str, nbytes: int) -> None:
        with lock:
            record = {"t": time.time(), "method": method, "path": path[:160], "bytes": nbytes}
            log.write(json.dumps(record) + "\n")
            log.flush()

    httpd = make_server(
        bucket, cert, key, address=("0.0.0.0", PORT), threaded=True, on_body=on_body
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: httpd.storage.wipe(keep_buckets=True))
    print(READY_LINE, flush=True)
    httpd.serve_forever()


def list_objects(bucket: str, prefix: str) -> None:
    """Inside the storage namespace: prints ``{name: size}`` of the objects under
    ``prefix``, asked over HTTPS as TensorFlow would."""
    import ssl
    import urllib.parse
    import urllib.request

    from integration.gcs_emulator import HOSTS

    context = ssl.create_default_context(cafile=os.environ["CURL_CA_BUNDLE"])
    objects, token = {}, None
    while True:
        query = {"prefix": prefix} | ({"pageToken": token} if token else {})
        url = f"https://{HOSTS[0]}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, context=context, timeout=60) as r:
            page = json.load(r)
        objects.update({o["name"]: int(o.get("size", 0)) for o in page.get("items") or []})
        token = page.get("nextPageToken")
        if not token:
            break
    print(json.dumps(objects))


# --- the workers --------------------------------------------------------------------


def worker(argv: list) -> int:
    """Inside a worker namespace: ``mwms_worker.py`` with the cluster on the namespaces'
    addresses and ``--model-mb`` MiB more variables in the model."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--addresses", required=True)
    parser.add_argument("--model-mb", type=int, required=True)
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1 :]
    sys.path.insert(0, str(TESTS / "integration"))
    import mwms_worker

    addresses = args.addresses.split(",")

    def tf_config(ports, index):
        return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}

    build_training = mwms_worker.build_training

    def build_with_ballast(strategy):
        import tensorflow as tf

        model, optimizer, step = build_training(strategy)
        sizes = []
        left = args.model_mb
        while left > 0:
            sizes.append(min(left, VARIABLE_MIB))
            left -= sizes[-1]
        with strategy.scope():
            model.ballast = [
                tf.Variable(
                    tf.random.stateless_uniform([mib * 2**18], seed=[i, 36]), name=f"ballast_{i}"
                )
                for i, mib in enumerate(sizes)
            ]
        return model, optimizer, step

    mwms_worker.tf_config = tf_config
    mwms_worker.build_training = build_with_ballast
    return mwms_worker.main(rest)


def cluster_class():
    from integration.conftest import Cluster
    from integration.mwms_worker import worker_command

    class NamespaceCluster(Cluster):
        """The tests' Cluster, each worker in its namespace, checkpointing to gs://."""

        net: Network
        ckpt_url: str
        model_mb: int

        def command(self, index: int) -> list:
            cmd = worker_command(
                Path(__file__),
                ports=self.ports,
                index=index,
                impl=self.impl,
                ckpt_dir=self.ckpt_url,
                steps=self.steps,
                step_sleep=self.step_sleep,
            )
            addresses = ",".join(f"{worker_ip(i)}:{WORKER_PORT}" for i in range(self.num_workers))
            return [
                "ip", "netns", "exec", self.net.workers[index], cmd[0], cmd[1], "_worker",
                "--addresses", addresses, "--model-mb", str(self.model_mb), "--", *cmd[2:],
            ]  # fmt: skip

    return NamespaceCluster


@dataclass
class Result:
    bytes: int
    link_bytes: int
    save_s: float
    exit_s: float
    #: Per worker: its saves' (start, end) and its exit, seconds after the SIGTERM.
    timeline: list
    #: The sizes of the checkpoint's data files (one per worker with ``shares``).
    parts: list


def one_run(variant, n, limit, args, net, store, root, run_id) -> Result:
    workdir = root / run_id
    impl, saves = VARIANTS[variant]
    cluster = cluster_class()(
        workdir,
        impl=impl,
        ckpt_dir=workdir / "unused",
        num_workers=n,
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        env={**store.env, **({NON_CHIEF_SAVES_ENV: saves} if saves else {})},
        name=run_id,
    )
    cluster.net = net
    cluster.ckpt_url = f"gs://{BUCKET}/{run_id}/train/ckpt"
    cluster.model_mb = args.model_mb
    try:
        cluster.start()
        cluster.wait_for_progress(NOTICE_AFTER, timeout=STARTUP_BOUND)
        rx0 = storage_rx_bytes(net)
        sent = cluster.send_signal(1)
        codes = cluster.wait(exit_bound(n, args), f"all {n} workers to save and exit after SIGTERM")
        rx = storage_rx_bytes(net) - rx0
        details = "\n".join(cluster.describe(i) for i in range(n))
        if codes != [42] * n:
            raise RuntimeError(f"{run_id}: exit codes {codes}\n{details}")
        saves = [e["t_end"] for i in range(n) for e in cluster.events(i, "save")]
        exits = [e["t"] for i in range(n) for e in cluster.events(i, "exit")]
        if not saves or len(exits) != n:
            raise RuntimeError(
                f"{run_id}: {len(saves)} save and {len(exits)} exit events\n{details}"
            )
        timeline = [
            (
                [(e["t_start"] - sent, e["t_end"] - sent) for e in cluster.events(i, "save")],
                cluster.events(i, "exit")[0]["t"] - sent,
            )
            for i in range(n)
        ]
        nbytes = store.bodies(sent)
        parts = check_checkpoint(
            store.list(net, f"{run_id}/"), f"{run_id}/train/ckpt/", n if variant == "shares" else 1,
            model_bytes(args), f"{run_id}\n{details}",
        )  # fmt: skip
        return Result(nbytes, rx, max(saves) - sent, max(exits) - sent, timeline, parts)
    finally:
        cluster.kill()
        store.wipe()


def check_checkpoint(objects: dict, folder: str, parts: int, size: int, what: str) -> list:
    """The sizes of the last checkpoint's data files in ``objects`` (name -> bytes);
    raises unless it is whole in ``folder``, in ``parts`` data files of ``size`` bytes
    together, and no copy or part is left."""
    indexes = sorted(
        (int(m.group(1)), name)
        for name in objects
        if (m := re.fullmatch(re.escape(folder) + r"ckpt-(\d+)\.index", name))
    )
    problems = []
    if folder + "checkpoint" not in objects:
        problems.append("no `checkpoint` file")
    if not indexes:
        problems.append("no ckpt-N.index")
    else:
        prefix = indexes[-1][1][: -len(".index")]
        data = sorted(name for name in objects if name.startswith(prefix + ".data-"))
        expected = [f"{prefix}.data-{i:05d}-of-{parts:05d}" for i in range(parts)]
        if data != expected:
            problems.append(f"data files {data}, expected {expected}")
        elif sum(objects[name] for name in data) < size:
            problems.append(f"data files of {sum(objects[d] for d in data)} bytes < {size}")
    left = [name for name in objects if "workertemp_" in name or "_temp/" in name]
    if left:
        problems.append(f"left in the bucket: {left}")
    if problems:
        listing = "\n".join(f"  {name} {objects[name]}" for name in sorted(objects))
        raise RuntimeError(
            f"the checkpoint is not whole: {'; '.join(problems)}\nbucket:\n{listing}\n{what}"
        )
    return [objects[name] for name in data]


def describe_timeline(timeline: list) -> str:
    """``w0 save 1.20-6.50 exit 6.60; w1 ...`` (seconds after the SIGTERM)."""
    parts = []
    for i, (saves, exit_s) in enumerate(timeline):
        spans = ", ".join(f"{a:.2f}-{b:.2f}" for a, b in saves) or "none"
        parts.append(f"w{i} save {spans} exit {exit_s:.2f}")
    return "; ".join(parts)


def exit_bound(n: int, args) -> float:
    """Bound on SIGTERM -> every worker gone: N copies at the limit, 3 times over, + 120 s."""
    return 120.0 + 3 * n * model_bytes(args) / (args.rate_mbps * 1e6 / 8)


def model_bytes(args) -> int:
    return args.model_mb * 2**20


# --- main ------------------------------------------------------------------------------


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB" if nbytes >= 10 * 2**20 else f"{nbytes / 2**20:.1f} MiB"


def preflight() -> str | None:
    from integration.gcs_emulator import unavailable_reason

    reason = unavailable_reason()
    if reason is None and shutil.which("tc") is None:
        reason = "the `tc` command is not installed"
    return reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", help=f"worker counts (default {DEFAULTS['workers']})")
    parser.add_argument(
        "--model-mb", type=int, help=f"MiB of variables (default {DEFAULTS['model_mb']})"
    )
    parser.add_argument(
        "--rate-mbps",
        type=float,
        help=f"the limit, Mbit/s (10^6 bit/s, tc's mbit; default {DEFAULTS['rate_mbps']:g})",
    )
    parser.add_argument("--repeats", type=int, help=f"default {DEFAULTS['repeats']}")
    parser.add_argument("--limits", default=",".join(LIMITS), help="per-writer, shared or both")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK} unless given")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    counts = [int(w) for w in args.workers.split(",")]
    limits = args.limits.split(",")
    if min(counts) < 2 or any(limit not in LIMITS for limit in limits):
        parser.error("--workers: counts >= 2; --limits: per-writer and/or shared")
    reason = preflight()
    if reason is not None:
        print(f"bench_save_copies: cannot run here: {reason}", file=sys.stderr)
        return 2
    # A SIGTERM to the bench unwinds it like Ctrl-C: namespaces and workers removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    one_copy_s = model_bytes(args) / (args.rate_mbps * 1e6 / 8)
    print(
        f"{args.model_mb} MiB of variables; limit {args.rate_mbps:g} Mbit/s: one copy takes "
        f"{one_copy_s:.1f} s at the limit",
        flush=True,
    )
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="tffh-bench-save-copies-") as tmp:
        root = Path(tmp)
        with network(max(counts)) as net, storage(net, root, exit_bound(max(counts), args)) as st:
            for n in counts:
                for limit in limits:
                    set_limit(net, limit, args.rate_mbps)
                    for rep in range(args.repeats):
                        for variant in VARIANTS:
                            run_id = f"{variant}-{n}w-{limit}-{rep}"
                            r = one_run(variant, n, limit, args, net, st, root, run_id)
                            results.setdefault((n, limit, variant), []).append(r)
                            print(
                                f"  {n} workers {limit:10} {variant:6} bodies {mib(r.bytes)}"
                                f" (link {mib(r.link_bytes)}), save done {r.save_s:.2f} s,"
                                f" exit {r.exit_s:.2f} s",
                                flush=True,
                            )
                            print(f"    {describe_timeline(r.timeline)}", flush=True)
                            data = " + ".join(mib(b) for b in r.parts)
                            print(f"    checkpoint whole, data files: {data}", flush=True)
    print_tables(results, counts, limits, args)
    return 0


def print_tables(results: dict, counts: list, limits: list, args) -> None:
    size = model_bytes(args)
    header = (
        "", "TensorFlow", "tf-failure-handling", "ours / TF",
        "tf-failure-handling, shares", "shares / TF",
    )  # fmt: skip

    def over_tf(value: float, tf: float) -> str:
        return _report.ratio(value / tf) if tf > 0 else "n/a"

    def cell(b: float) -> str:
        return f"{mib(b)} ({b / size:.2f}{_report.TIMES} the model)"

    def med(field: str, keys: list) -> float:
        return statistics.median(getattr(r, field) for key in keys for r in results[key])

    rows = []
    for n in counts:
        tf_b, ours_b, shares_b = (med("bytes", [(n, lim, v) for lim in limits]) for v in VARIANTS)
        rows.append(
            (f"{n} workers", cell(tf_b), cell(ours_b), over_tf(ours_b, tf_b),
             cell(shares_b), over_tf(shares_b, tf_b))
        )  # fmt: skip
    runs = args.repeats * len(limits)
    _report.print_readme_table(
        f"bytes written to the checkpoint's storage per preemption save ({mib(size)} model, "
        f"medians of {runs})",
        header,
        rows,
    )
    rows = []
    for n in counts:
        for limit in limits:
            for field, what in (("save_s", "last save done"), ("exit_s", "last exit")):
                tf_s, ours_s, shares_s = (med(field, [(n, limit, v)]) for v in VARIANTS)
                rows.append(
                    (f"{n} workers, {limit} limit: SIGTERM \u2192 {what}", f"{tf_s:.2f} s",
                     f"{ours_s:.2f} s", over_tf(ours_s, tf_s), f"{shares_s:.2f} s",
                     over_tf(shares_s, tf_s))
                )  # fmt: skip
    _report.print_readme_table(
        f"preemption save under a {args.rate_mbps:g} Mbit/s storage limit ({mib(size)} model, "
        f"medians of {args.repeats})",
        header,
        rows,
    )
    print(_report.provenance())
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        serve(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "_list":
        list_objects(*sys.argv[2:4])
    elif len(sys.argv) > 1 and sys.argv[1] == "_worker":
        sys.exit(worker(sys.argv[2:]))
    else:
        sys.exit(main())
