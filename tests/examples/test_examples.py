"""Every example in ``examples/`` runs for real: preempted, restarted, finished.

Each TensorFlow example runs under ``examples/launch_local.py`` (one process per task
on 127.0.0.1, restarted on exit code 42 or 143, as a cluster launcher would), gets one
SIGTERM once training is under way, and must then: save in every trainer at one step,
exit with the restart code, start again at exactly that step, and finish. The custom
loop runs through ``make demo``'s script, which also compares the resumed run's weights
with an uninterrupted run's. The cloud startup script runs against fake GCE, AWS and
Azure metadata servers, and the Kubernetes manifest's container command runs as two
local "pods". (``examples/slurm`` is run by ``tests/slurm`` against a real SLURM.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_metadata import FakeMetadata, aws_action, azure_event
from integration.mwms_worker import child_environment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import launch_local  # noqa: E402 - examples/launch_local.py, through the path above

#: Bounds one launcher run (TF imports, two attempts); only turns a hang into a failure.
#: An idle machine needs under a minute; under `make test`'s load (twelve jobs on two
#: cores) a restarted worker once spent 100 s in `import tensorflow` alone.
RUN_BOUND = 600.0
SAVED = re.compile(r"^preempted: checkpoint saved at step (\d+), exiting with code (\d+)$")
STARTED = re.compile(r"^starting at step (\d+)$")
FINISHED = re.compile(r"^finished at step (\d+)\b")

if importlib.util.find_spec("tensorflow") is None:  # under CI=true: a failure (conftest.py)
    pytest.skip("tensorflow is not installed: the examples need it", allow_module_level=True)


def launch(command, **kwargs) -> launch_local.Result:
    lines = []
    result = launch_local.launch(
        [str(c) for c in command],
        timeout=RUN_BOUND,
        env=child_environment(),
        echo=lines.append,
        **kwargs,
    )
    result.transcript = "\n".join(lines)
    return result


def matching(lines, pattern) -> list[int]:
    return [int(found.group(1)) for line in lines if (found := pattern.match(line))]


def check_preempted_and_resumed(result, trainers, *, code: int = 42) -> int:
    """Every trainer saved at one step and exited ``code``, started again at that step
    and finished; returns the step."""
    assert result.finished, result.transcript
    saved = set()
    for task in trainers:
        first, second = ([ln for t, a, ln in result.lines if t == task and a == n] for n in (0, 1))
        said = [m.groups() for line in first if (m := SAVED.match(line))]
        assert len(said) == 1, result.transcript
        step, exit_code = map(int, said[0])
        assert exit_code == code, result.transcript
        assert (task, 0, code) in result.exits, result.transcript
        assert matching(first, STARTED) == [0], result.transcript
        assert matching(second, STARTED) == [step], result.transcript
        assert matching(second, FINISHED), result.transcript
        saved.add(step)
    assert len(saved) == 1 and saved != {0}, result.transcript
    return saved.pop()


# Backstop above its own bound: the demo's two runs, RUN_BOUND each (+ 60 s, + 60 s).
@pytest.mark.timeout(2 * RUN_BOUND + 120)
def test_make_demo_runs_the_custom_loop_example(tmp_path):
    """``make demo``: examples/mwms_custom_loop.py on 2 workers, SIGTERM to one, the
    restart; the resumed run's weights equal an uninterrupted run's."""
    done = subprocess.run(
        [
            sys.executable,
            ROOT / "demo" / "run_demo.py",
            *("--steps", "60", "--output", tmp_path, "--timeout", str(RUN_BOUND)),
        ],
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=2 * RUN_BOUND + 60,
    )
    out = done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, out
    assert "RESULT: the resumed run's final weights EQUAL the uninterrupted run's" in out, out
    assert re.search(r"the workers saved at step \[(\d+)\] and resumed at step \[\1\]", out), out
    assert (tmp_path / "timeline.png").is_file(), out


@pytest.mark.timeout(RUN_BOUND + 60)
def test_parameter_server_example_coordinator_preempted(tmp_path):
    result = launch(
        [EXAMPLES / "parameter_server.py", "--ckpt-dir", tmp_path / "ckpt", "--steps", "100"],
        chief=True,
        workers=1,
        ps=1,
        preempt="chief:0@40",
    )
    assert check_preempted_and_resumed(result, ["chief:0"]) >= 40
    # The PS and the worker kept serving through the coordinator's restart.
    assert {task for task, _, _ in result.exits} == {"chief:0"}, result.transcript


#: (script, its directory option, workers, the task to preempt): one process per worker.
FIT_EXAMPLES = {
    "tf_keras_fit.py": ("--backup-dir", 2, "worker:0"),
    "keras3_fit.py": ("--ckpt-dir", 1, "worker:0"),
    "orbit_controller.py": ("--model-dir", 1, "worker:0"),
}


@pytest.mark.timeout(RUN_BOUND + 60)
@pytest.mark.parametrize("script", sorted(FIT_EXAMPLES))
def test_example_preempted_under_way(script, tmp_path):
    """tf_keras and Keras 3 ``fit``, orbit's ``Controller``: SIGTERM at step 30."""
    if script.startswith("orbit"):
        pytest.importorskip("orbit")
    option, workers, target = FIT_EXAMPLES[script]
    result = launch(
        [EXAMPLES / script, option, tmp_path / "out"], workers=workers, preempt=f"{target}@30"
    )
    step = check_preempted_and_resumed(result, [f"worker:{i}" for i in range(workers)])
    assert step >= 30, result.transcript
    if script.startswith("orbit"):  # the checkpoint is numbered by orbit's global step
        assert (tmp_path / "out" / f"ckpt-{step}.index").is_file(), result.transcript


# -- the clouds -------------------------------------------------------------------

#: The exit code each cloud's notice ends in (GCE's is TensorFlow's 143).
CLOUD_EXIT = {"gce": 143, "aws": 42, "azure": 42}
#: Seconds between the AWS/Azure notice and the termination it announces.
LEAD = 3.0


def announce(server: FakeMetadata, cloud: str) -> None:
    if cloud == "gce":
        server.gce_preempted = "TRUE"
    elif cloud == "aws":
        server.aws_instance_action = aws_action("terminate", in_seconds=LEAD)
    else:
        server.azure_events = [azure_event("Preempt", resources=("vm0",), not_before_in=LEAD)]


def withdraw(server: FakeMetadata, cloud: str) -> None:
    """The next VM's metadata server: no notice."""
    server.gce_preempted = "FALSE"
    server.aws_instance_action = None
    server.azure_events = []


def boot(env: dict, server: FakeMetadata, cloud: str, notice_at: int | None):
    """One VM boot: examples/clouds/startup.sh until it exits; the notice published
    once training reaches ``notice_at``. Returns (exit code, stdout lines)."""
    lines = []
    with subprocess.Popen(
        ["sh", str(EXAMPLES / "clouds" / "startup.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        # The boot's bound: past it the process is killed, which ends the reading below.
        timer = threading.Timer(RUN_BOUND, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                steps = matching(lines[-1:], launch_local.STEP_LINE)
                if notice_at is not None and steps and steps[0] >= notice_at:
                    announce(server, cloud)
                    notice_at = None
            code = proc.wait(timeout=RUN_BOUND)
            assert timer.is_alive(), (
                f"the boot did not end within {RUN_BOUND:g} s; its last lines:\n"
                + "\n".join(lines[-20:])
            )
            return code, lines
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()


# Backstop above its own bounds in sequence: two boots of RUN_BOUND each (+ 60 s).
@pytest.mark.timeout(2 * RUN_BOUND + 60)
@pytest.mark.parametrize("cloud", ["gce", "aws", "azure"])
def test_cloud_startup_script(cloud, tmp_path):
    """examples/clouds/startup.sh on a fake VM of each cloud: the cloud's notice, the
    save, the cloud's exit code; the next boot resumes at the saved step and finishes."""
    with FakeMetadata() as server:
        env = {
            **child_environment(),
            **server.env(cloud),
            "TF_FAILURE_HANDLING_CLOUD": cloud,
            "PYTHON": sys.executable,
            "TRAIN": str(EXAMPLES / "mwms_custom_loop.py"),
            "CKPT_DIR": str(tmp_path / "ckpt"),
            "TRAIN_ARGS": "--steps 300 --step-time 0.02",
        }
        code, first = boot(env, server, cloud, notice_at=20)
        transcript = "\n".join(first)
        assert code == CLOUD_EXIT[cloud], transcript
        saved = [m.groups() for line in first if (m := SAVED.match(line))]
        assert len(saved) == 1 and int(saved[0][1]) == code, transcript
        step = int(saved[0][0])
        assert step >= 20, transcript
        withdraw(server, cloud)
        code, second = boot(env, server, cloud, notice_at=None)
        transcript += "\n--- next boot\n" + "\n".join(second)
        assert code == 0, transcript
        assert matching(second, STARTED) == [step], transcript
        assert matching(second, FINISHED) == [300], transcript


# -- Kubernetes -------------------------------------------------------------------

MANIFEST = EXAMPLES / "kubernetes" / "job.yaml"


def manifest():
    yaml = pytest.importorskip("yaml")
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}
    job, service = docs["Job"], docs["Service"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    return job, service, pod, container, env


def test_kubernetes_manifest_settings_agree():
    job, service, pod, container, env = manifest()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert int(env["WORKERS"]) == spec["completions"] == spec["parallelism"]
    assert env["TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"] == str(
        pod["terminationGracePeriodSeconds"]
    )
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    rules = spec["podFailurePolicy"]["rules"]
    exit_rule = next(r for r in rules if "onExitCodes" in r)
    assert exit_rule["action"] == "Ignore"
    assert exit_rule["onExitCodes"] == {
        "containerName": container["name"],
        "operator": "In",
        "values": [42],
    }
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    # The image holds what the manifest runs, and the examples' modules it imports.
    train = EXAMPLES / Path(env["TRAIN"]).name
    dockerfile = (EXAMPLES / "kubernetes" / "Dockerfile").read_text()
    assert f"COPY examples/{train.name} {env['TRAIN']}" in dockerfile
    imported = re.findall(r"^from (\w+) import|^import (\w+)$", train.read_text(), re.M)
    for module in {name for pair in imported for name in pair if name}:
        if (EXAMPLES / f"{module}.py").is_file():
            assert f"COPY examples/{module}.py /app/{module}.py" in dockerfile, module


def pod_command(tmp_path: Path) -> list[str]:
    """The container's command, with ``python3`` meaning this interpreter."""
    _, _, _, container, _ = manifest()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    return [*container["command"], *container["args"]]


def pod_env(tmp_path: Path, **overrides) -> dict:
    _, _, _, _, env = manifest()
    return {
        **child_environment(),
        **env,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        **overrides,
    }


def test_kubernetes_pod_builds_tf_config_from_its_index(tmp_path):
    command = pod_command(tmp_path)
    show = tmp_path / "show_tf_config.py"
    show.write_text(
        "import json, os, sys\n"
        "print(json.dumps([json.loads(os.environ['TF_CONFIG']), sys.argv[1:]]))\n"
    )
    env = pod_env(tmp_path, JOB_COMPLETION_INDEX="1", TRAIN=str(show))
    env.pop("TF_CONFIG", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tf_config, args = json.loads(done.stdout)
    assert tf_config == {
        "cluster": {"worker": ["tfh-train-0.tfh-train:2222", "tfh-train-1.tfh-train:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert args == ["--ckpt-dir", "/checkpoints/tfh-train", "--steps", "100000", "--step-time", "0"]


@pytest.mark.timeout(RUN_BOUND + 60)
def test_kubernetes_pods_are_preempted_and_started_again(tmp_path):
    """The container's command as two local pods (TF_CONFIG on 127.0.0.1 instead of
    the Service's names): the kubelet's SIGTERM to one, exit 42 from both (which the
    Job's podFailurePolicy ignores), new pods resume at the saved step and finish."""
    command = pod_command(tmp_path)
    env = pod_env(
        tmp_path,
        TRAIN=str(EXAMPLES / "mwms_custom_loop.py"),
        CKPT_DIR=str(tmp_path / "checkpoints"),
        TRAIN_ARGS="--steps 120 --step-time 0.02",
    )
    lines = []
    # launch_local runs Python scripts: this one execs the pod's shell command (the
    # training stays the process that gets the SIGTERM).
    exec_pod = f"import os; os.execvpe({command[0]!r}, {command!r}, os.environ)"
    result = launch_local.launch(
        ["-c", exec_pod],
        workers=2,
        preempt="worker:1@30",
        timeout=RUN_BOUND,
        env=env,
        echo=lines.append,
    )
    result.transcript = "\n".join(lines)
    assert check_preempted_and_resumed(result, ["worker:0", "worker:1"]) >= 30


# Backstop above its own bound (the launcher's 2 s, its kills: 10 s a task).
@pytest.mark.timeout(60)
def test_launcher_gives_up_at_its_bound_while_a_task_keeps_printing(tmp_path):
    """``launch(timeout=...)`` is a bound on the whole run: a task that prints without
    end (a loop stuck after its first steps, logging) is killed when it passes, not only
    when no line comes for that long."""
    chatty = tmp_path / "chatty.py"
    chatty.write_text("while True:\n    print('step 0')\n")  # faster than they are read
    lines: list = []
    result = launch_local.launch(
        [str(chatty)], timeout=2.0, logs=tmp_path / "logs", echo=lines.append
    )
    assert not result.finished and result.output("worker:0"), lines[-3:]
    assert "launch_local: the run did not end within 2 s; killing every task" in lines
