"""``dev/timed.py`` (each ``make test`` job's wall and CPU time) and the table that
``dev/prereqs.py summary`` prints from it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# dev/prereqs.py imports its neighbour dev/timed.py, as it does when run as a script.
sys.path.insert(0, str(ROOT / "dev"))


def _load(name: str, times: Path):
    spec = importlib.util.spec_from_file_location(f"dev_{name}", ROOT / "dev" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if name == "timed":
        module.TIMES = times
    else:
        module.JOB_TIMES = times
    return module


def test_a_job_is_recorded_with_its_childrens_cpu_and_its_exit_status(tmp_path):
    times = tmp_path / "job-times.tsv"
    timed = _load("timed", times)
    # The job burns CPU in a grandchild it waits for, then fails with 3.
    burn = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        + repr(
            "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
        )
        + "]); sys.exit(3)"
    )
    assert timed.main(["timed.py", "slow-job", sys.executable, "-c", burn]) == 3
    [line] = times.read_text().splitlines()
    name, wall, cpu, code, every = line.split("\t")
    assert name == "slow-job" and code == "3"
    assert int(cpu) >= 1 and int(wall) >= int(cpu) - 1  # the grandchild's 0.6 s counted
    # As root, the cgroup counts it too; elsewhere the column says it could not.
    assert every == "-" or int(every) >= 1, line


def test_a_process_the_job_does_not_wait_for_is_counted_by_the_cgroup(tmp_path):
    timed = _load("timed", tmp_path / "job-times.tsv")
    burn = "import time\nend = time.process_time() + 1.2\nwhile time.process_time() < end: pass"
    # The burner is started in a session of its own and never waited for by the job.
    job = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
        + repr(burn)
        + "], start_new_session=True); time.sleep(0.1); "
        + "import os; os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT); os._exit(0)"
    )
    assert timed.main(["timed.py", "unwaited", sys.executable, "-c", job]) == 0
    _, _, cpu, _, every = (tmp_path / "job-times.tsv").read_text().strip().split("\t")
    writable = [r for r, _ in timed.cgroup_roots() if os.access(r, os.W_OK) and os.geteuid() == 0]
    if every == "-" and not writable:
        pytest.skip("no cgroup can be made here (needs root and a writable cgroup file system)")
    assert int(every) >= 1 and int(cpu) == 0, (cpu, every)


def test_the_summary_lists_the_longest_job_first(tmp_path, capsys):
    times = tmp_path / "job-times.tsv"
    times.write_text("docs\t13\t12\t0\npytest-rest\t2100\t900\t0\nbroken line\nlint\t200\t180\t2\n")
    prereqs = _load("prereqs", times)
    prereqs.NOT_RUN = tmp_path / "not-run.txt"
    assert prereqs.summary("test") == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:4]] == ["pytest-rest", "lint", "docs"]
    assert "35 min  0 s" in out[1] and out[1].split()[-3:] == ["s", "0", "-"]
    assert out[4].startswith("all jobs") and "1092 s" in out[4] and out[4].split()[-1] == "-"
    assert out[-1] == "make test: passed; every part ran."


def test_the_summary_adds_the_cpu_of_every_process_where_a_cgroup_counted_it(tmp_path, capsys):
    times = tmp_path / "job-times.tsv"
    times.write_text("docs\t13\t12\t0\t14\npytest-rest\t2100\t900\t0\t1500\n")
    prereqs = _load("prereqs", times)
    prereqs.NOT_RUN = tmp_path / "not-run.txt"
    assert prereqs.summary("test") == 0
    out = capsys.readouterr().out.splitlines()
    assert "CPU, every process" in out[0]
    assert out[1].split()[-3:] == ["0", "1500", "s"] and out[2].split()[-3:] == ["0", "14", "s"]
    assert out[3].startswith("all jobs") and out[3].split()[-2:] == ["1514", "s"]


def test_the_summary_after_a_failure_names_the_failed_jobs_and_keeps_the_status(tmp_path, capsys):
    times = tmp_path / "job-times.tsv"
    times.write_text("docs\t13\t12\t0\npytest-rest\t2100\t900\t1\nlint\t200\t180\t2\n")
    prereqs = _load("prereqs", times)
    prereqs.NOT_RUN = tmp_path / "not-run.txt"
    prereqs.NOT_RUN.write_text("slurm-suite\tneeds root (run as root)\n")
    assert prereqs.main(["prereqs.py", "summary", "test", "2"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("job") and out[1].startswith("pytest-rest")
    assert out[-2] == "make test: FAILED (exit 2); failed jobs: pytest-rest, lint"
    assert out[-1] == "  NOT RUN  slurm-suite: needs root (run as root)"


def test_timed_without_a_command_prints_its_usage():
    done = subprocess.run(
        [sys.executable, ROOT / "dev" / "timed.py", "only-a-name"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "timed.py NAME COMMAND" in done.stderr


def test_time_make_writes_the_runs_jobs_longest_first_with_both_cpu_totals(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benches"))
    spec = importlib.util.spec_from_file_location("time_make", ROOT / "benches" / "time_make.py")
    time_make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(time_make)
    times = tmp_path / "job-times.tsv"
    times.write_text(
        "docs\t54\t4\t0\t4\ncompat-ends\t1357\t421\t2\t427\nbroken\tx\nlint\t600\t50\t0\n"
    )
    lines = time_make.job_rows(times).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "compat-ends",
        "lint",
        "docs",
        "all jobs",
    ]
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == [
        "compat-ends",
        "22 min 37 s",
        "421 s",
        "427 s",
        "2",
    ]
    # lint's line has no cgroup column (an older timed.py, or no cgroup): no total then.
    assert [c.strip() for c in lines[-1].split("|")[1:-1]] == ["all jobs", "", "475 s", "-", ""]
    assert time_make.job_rows(tmp_path / "missing.tsv") == ""
