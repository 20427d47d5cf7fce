"""The test clusters' fork server (tests/integration/forkserver.py): a forked child is
``python SCRIPT ARGS`` as far as the script and the test can tell, and nothing outlives
the test process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from integration import forkserver

#: Bounds on one child's run; they only turn a hang into a failure. A server's start
#: (its ``import tensorflow``) has forkserver.START_BOUND.
RUN_BOUND = 60.0
pytestmark = pytest.mark.timeout(2 * forkserver.START_BOUND + 4 * RUN_BOUND)

CHILD = """
import atexit, json, os, sys, threading, time
mode = sys.argv[1]
print(json.dumps({
    "argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
    "env": os.environ.get("FORK_TEST"), "ppid": os.getppid(), "pid": os.getpid(),
    "tf_imported": "tensorflow" in sys.modules,
    "ours_imported": "tf_failure_handling" in sys.modules, "sid": os.getsid(0),
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    raise ValueError("raised by the script")
if mode == "atexit":
    atexit.register(lambda: print("atexit ran", flush=True))
    def late():
        time.sleep(0.2)
        print("thread joined", flush=True)
    threading.Thread(target=late).start()
if mode == "sleep":
    print("sleeping", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(CHILD))
    return path


def child_env(**extra) -> dict:
    env = dict(os.environ, FORK_TEST="from the request", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(script, *args, tmp_path, env=None, cwd=None):
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = forkserver.popen(
            [sys.executable, script, *args],
            stdout=o,
            stderr=e,
            stdin=subprocess.DEVNULL,
            env=env or child_env(),
            cwd=cwd or tmp_path,
        )
    assert isinstance(proc, forkserver.ForkedProcess)
    try:
        code = proc.wait(timeout=RUN_BOUND)
    except subprocess.TimeoutExpired:
        # Say where the child was, and end it: its status socket is then read and
        # closed here, not left for the garbage collector to report in a later test.
        where = _where(proc.pid)
        proc.kill()
        proc.wait(timeout=RUN_BOUND)
        pytest.fail(
            f"child {proc.pid} ({' '.join(args)}) did not exit within {RUN_BOUND:g}s: "
            f"{where}\nits stdout: {out.read_text()!r}\nits stderr: {err.read_text()!r}"
        )
    return code, out.read_text().splitlines(), err.read_text()


def _where(pid: int) -> str:
    """A process's state and the kernel function it waits in, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next((line.strip() for line in f if line.startswith("State:")), "?")
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    except OSError as e:
        return f"<{e}>"
    return f"{state}, waiting in {wchan}"


def first_json(lines):
    return json.loads(lines[0])


def test_a_child_is_the_script_run_as_main_with_its_argv_env_cwd_and_exit_code(script, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    code, lines, err = run(script, "exit", "42", tmp_path=tmp_path, cwd=cwd)
    seen = first_json(lines)
    assert code == 42
    assert seen["argv"] == [str(script), "exit", "42"]
    assert seen["name"] == "__main__"
    assert seen["cwd"] == str(cwd)
    assert seen["path0"] == str(script.parent)
    assert seen["env"] == "from the request"
    # The server imported TensorFlow; the package is the child's own import, as in a
    # fresh process (it calls patch() before or after, as the script says).
    assert seen["tf_imported"] and not seen["ours_imported"]
    assert "to stderr" in err
    assert seen["sid"] != seen["pid"]  # in the session it was started from, as Popen's


def test_start_new_session_and_stderr_to_stdout_as_popen(script, tmp_path):
    out = tmp_path / "out"
    with open(out, "wb") as o:
        proc = forkserver.popen(
            [sys.executable, script, "exit", "0"],
            stdout=o,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            start_new_session=True,
        )
    assert isinstance(proc, forkserver.ForkedProcess)
    assert proc.wait(timeout=RUN_BOUND) == 0
    lines = out.read_text().splitlines()
    seen = first_json(lines)
    assert seen["sid"] == seen["pid"] == proc.pid  # leads a session (and its group)
    assert lines[1:] == ["to stderr"]


def test_an_uncaught_exception_exits_1_with_its_traceback(script, tmp_path):
    code, _, err = run(script, "raise", tmp_path=tmp_path)
    assert code == 1
    assert "ValueError: raised by the script" in err


def test_atexit_hooks_run_and_threads_are_joined_at_the_end(script, tmp_path):
    code, lines, _ = run(script, "atexit", tmp_path=tmp_path)
    assert code == 0
    assert lines[1:] == ["thread joined", "atexit ran"]


def test_signals_poll_wait_and_a_pipe_behave_as_popen(script):
    proc = forkserver.popen(
        [sys.executable, script, "sleep"], stdout=subprocess.PIPE, env=child_env(), text=True
    )
    try:
        first_json([proc.stdout.readline()])
        assert proc.stdout.readline() == "sleeping\n"
        assert proc.poll() is None and proc.returncode is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=RUN_BOUND) == -signal.SIGTERM
        assert proc.poll() == -signal.SIGTERM
        proc.kill()  # after the exit: nothing, as Popen
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.stdout.close()


def test_an_import_environment_of_its_own_gets_a_server_of_its_own(script, tmp_path):
    a = first_json(run(script, "exit", "0", tmp_path=tmp_path)[1])
    b = first_json(run(script, "exit", "0", tmp_path=tmp_path)[1])
    c = first_json(
        run(script, "exit", "0", tmp_path=tmp_path, env=child_env(TF_CPP_MIN_LOG_LEVEL="3"))[1]
    )
    assert a["ppid"] == b["ppid"] != c["ppid"]
    assert a["pid"] != b["pid"]
    # TF_CONFIG and our own variables are read after the import: they choose no server.
    assert forkserver.import_key(child_env(TF_CONFIG="{}", TF_FAILURE_HANDLING_X="1")) == (
        forkserver.import_key(child_env())
    )


def test_other_programs_and_the_switch_go_to_popen(script, monkeypatch):
    proc = forkserver.popen(["true"])
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=RUN_BOUND) == 0
    proc = forkserver.popen([sys.executable, "-c", "pass"])
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=RUN_BOUND) == 0
    # stderr into a pipe that stdout also goes to: Popen's job.
    proc = forkserver.popen(
        [sys.executable, script, "exit", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=child_env(),
    )
    assert isinstance(proc, subprocess.Popen)
    assert "to stderr" in proc.communicate(timeout=RUN_BOUND)[0].decode()
    monkeypatch.setenv(forkserver.SWITCH_ENV, "0")
    proc = forkserver.popen([sys.executable, script, "exit", "3"], stdout=subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=RUN_BOUND) == 3


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_nothing_outlives_the_test_process(tmp_path, script):
    """A test process killed (pytest-timeout, say) leaves no server and no child: the
    server kills its children when its control connection ends, and a child dies with
    its server."""
    pids = tmp_path / "pids"
    client = tmp_path / "client.py"
    client.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            sys.path.insert(0, {str(Path(forkserver.__file__).parents[1])!r})
            from integration import forkserver
            proc = forkserver.popen([sys.executable, {str(script)!r}, "sleep"],
                                    stdout=subprocess.PIPE, text=True)
            proc.stdout.readline(); proc.stdout.readline()
            server = next(iter(forkserver._servers.values())).proc.pid
            open({str(pids)!r}, "w").write(f"{{server}} {{proc.pid}}")
            time.sleep(600)
            """
        )
    )
    runner = subprocess.Popen([sys.executable, client], env=child_env())
    deadline = time.monotonic() + forkserver.START_BOUND + RUN_BOUND
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
        assert runner.poll() is None, "the client ended before starting its child"
        time.sleep(0.1)
    server, child = map(int, pids.read_text().split())
    runner.kill()
    runner.wait(timeout=RUN_BOUND)
    deadline = time.monotonic() + RUN_BOUND
    while (alive(server) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), f"the forked child {child} outlived the test process"
    assert not alive(server), f"the fork server {server} outlived the test process"
