"""The README's Quickstart runs as written, preempted and resumed.

The block is taken from the README itself and run as a script in a fresh
process of this interpreter (in the compatibility matrix: a virtualenv with
the wheel installed and no Rust on the ``PATH``), with its checkpoint directory
moved into the test's own. Success: a first run sent SIGTERM at its 50th
``run()`` exits 42 with a checkpoint; the second run starts at the saved step,
which is the 50th or later, and finishes with ``weight`` equal to the number of
steps (no step lost or repeated).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from integration.mwms_worker import child_environment

README = Path(__file__).resolve().parents[2] / "README.md"
#: Bounds one run of the script (TF import, MWMS set-up, 300 steps); a hang fails.
RUN_TIMEOUT_S = 300

#: Bound on the wait, after the SIGTERM, for the handler to have taken the notice.
NOTICE_TAKEN_S = 60

#: Prepended to the block: SIGTERM to this process when the handler's 50th run() starts,
#: as a platform would send it. (The block itself is unchanged.)
PREEMPT_AT_50 = """
import os, signal, time
import tf_failure_handling
_run = tf_failure_handling.PreemptionCheckpointHandler.run
_calls = [0]
def _preempting_run(self, fn, *args, **kwargs):
    _calls[0] += 1
    if _calls[0] == 50:
        os.kill(os.getpid(), signal.SIGTERM)
        # The handler's driver thread takes the notice; a platform leaves it time to,
        # so wait (at most NOTICE_TAKEN_S) until it has: on a loaded machine the
        # remaining 250 steps could otherwise end before it runs at all.
        _end = time.monotonic() + NOTICE_TAKEN_S
        while not self._attention and time.monotonic() < _end:
            time.sleep(0.01)
    return _run(self, fn, *args, **kwargs)
tf_failure_handling.PreemptionCheckpointHandler.run = _preempting_run
"""


def quickstart_block() -> str:
    text = README.read_text()
    after = text[text.index("## Quickstart") :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("```", start)]


def run_script(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def starting_step(out: subprocess.CompletedProcess) -> int:
    found = re.search(r"^starting at step (\d+)$", out.stdout, re.M)
    assert found, out.stdout + out.stderr[-3000:]
    return int(found.group(1))


@pytest.mark.timeout(4 * RUN_TIMEOUT_S)
def test_readme_quickstart_is_preempted_and_resumes(tmp_path):
    block = quickstart_block()
    assert '"/tmp/quickstart"' in block and "STEPS = 300" in block
    code = block.replace('"/tmp/quickstart"', repr(str(tmp_path / "ckpt")))

    first = run_script(f"NOTICE_TAKEN_S = {NOTICE_TAKEN_S}\n" + PREEMPT_AT_50 + code, tmp_path)
    assert first.returncode == 42, f"exit {first.returncode}\n{first.stdout}{first.stderr[-3000:]}"
    assert starting_step(first) == 0
    assert "finished" not in first.stdout

    second = run_script(code, tmp_path)
    assert second.returncode == 0, f"exit {second.returncode}\n{second.stderr[-3000:]}"
    resumed = starting_step(second)
    assert 50 <= resumed < 300, second.stdout
    assert "finished: weight 300.0" in second.stdout, second.stdout
