"""What the machine needs before ``make demo``, ``make check`` or ``make test`` start.

    python3 dev/prereqs.py demo|check|test         checks; one line per missing thing
    python3 dev/prereqs.py summary test [STATUS]  the final summary of ``make test``

Runs on the system's ``python3`` with nothing but the standard library: it is the
first thing a fresh machine runs. Each missing prerequisite is one line with the
command that installs it, and the make target stops (exit 1) before anything else
starts.

Some parts of ``make test`` need more than the rest: root on Debian (the SLURM suite
installs and starts ``slurm-wlm`` and ``munge``; the partition trials and the GCS
emulator test make network namespaces) and pyenv's CPython 3.10 and 3.13 (the
compatibility ends). Under ``CI=true`` their absence is a missing prerequisite like any
other. Elsewhere those parts do not run: each is written to :data:`NOT_RUN` with why,
the Makefile skips the jobs named there, and ``summary`` ends ``make test`` with a
line per part that did not run — never a silent green.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import timed  # dev/timed.py, this script's neighbour: it writes job-times.tsv

ROOT = Path(__file__).resolve().parent.parent
#: The parts of ``make test`` that will not run on this machine, one ``part<TAB>why``
#: per line (written by the check, read by the Makefile and by ``summary``).
NOT_RUN = ROOT / "build" / "not-run.txt"
#: Each job's wall and CPU seconds, written by dev/timed.py during `make test`.
JOB_TIMES = ROOT / "build" / "job-times.tsv"
RUSTUP = "curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y"
#: The pyenv interpreters the compatibility ends need (tests/compat/run_matrix.py --ends).
PYENV_VERSIONS = ("3.10", "3.13")
MIN_PYTHON = (3, 10)


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def _version(text: str) -> tuple:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x or 0) for x in m.groups()) if m else ()


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def rust_version_needed() -> tuple:
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r'^rust-version\s*=\s*"([^"]+)"', text, re.M)
    return _version(m.group(1)) if m else ()


def pyenv_root() -> Path:
    out = _run("pyenv", "root").strip()
    if out and Path(out).is_dir():
        return Path(out)
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def pyenv_has(version: str) -> bool:
    versions = pyenv_root() / "versions"
    try:
        return any(
            (p / "bin" / "python").exists()
            for p in versions.iterdir()
            if re.fullmatch(re.escape(version) + r"\.\d+", p.name)
        )
    except OSError:  # no such folder, or not this user's
        return False


def missing_tools() -> list:
    """What every target needs: (what, command that installs it)."""
    missing = []
    if sys.version_info < MIN_PYTHON:
        missing.append(
            (f"Python >= {'.'.join(map(str, MIN_PYTHON))} as python3", "apt-get install python3")
        )
    if not (ROOT / ".venv" / "bin" / "python").exists():
        try:
            import ensurepip  # noqa: F401
            import venv  # noqa: F401
        except ImportError:
            v = f"{sys.version_info.major}.{sys.version_info.minor}"
            missing.append(
                ("python3's venv and ensurepip", f"apt-get install python3-venv python{v}-venv")
            )
    if not (shutil.which("cc") or shutil.which("gcc")):
        missing.append(
            ("a C compiler and linker (cc), for Rust", "apt-get install build-essential")
        )
    needed = rust_version_needed()
    if not shutil.which("cargo"):
        missing.append(("Rust (cargo, rustc)", RUSTUP))
    elif needed and _version(_run("rustc", "--version")) < needed:
        have = _run("rustc", "--version").strip() or "rustc"
        fix = "rustup update stable" if shutil.which("rustup") else RUSTUP
        missing.append((f"Rust >= {'.'.join(map(str, needed))} (found {have})", fix))
    return missing


def test_parts() -> list:
    """The parts of ``make test`` this machine cannot run: (part, why, command)."""
    parts = []
    root = os.geteuid() == 0
    apt = shutil.which("apt-get") is not None
    if not root:
        why = "not root: Debian's slurm-wlm and munge are installed and their daemons started"
        parts.append(("slurm-suite", why, "run make test as root"))
        why = "not root: the partition trials and the GCS emulator test make network namespaces"
        parts.append(("netns", why, "run make test as root"))
    elif not apt and not shutil.which("slurmctld"):
        parts.append(
            ("slurm-suite", "no apt-get to install slurm-wlm and munge", "a Debian machine")
        )
    absent = [v for v in PYENV_VERSIONS if not pyenv_has(v)]
    if absent:
        if shutil.which("pyenv") or os.access(pyenv_root() / "bin" / "pyenv", os.X_OK):
            fix = f"pyenv install {' '.join(absent)}"
        else:
            fix = f"curl https://pyenv.run | bash, then pyenv install {' '.join(absent)}"
        parts.append(("compat-ends", f"no pyenv CPython {', '.join(absent)}", fix))
    return parts


def check(target: str) -> int:
    missing = [(what, fix) for what, fix in missing_tools()]
    not_run = test_parts() if target == "test" else []
    if is_ci():
        missing += [(f"what {part} needs under CI=true ({why})", fix) for part, why, fix in not_run]
        not_run = []
    NOT_RUN.parent.mkdir(parents=True, exist_ok=True)
    NOT_RUN.write_text("".join(f"{part}\t{why} ({fix})\n" for part, why, fix in not_run))
    for what, fix in missing:
        print(f"make {target}: missing {what}. Install: {fix}")
    for part, why, fix in not_run:
        print(f"make {target}: {part} will not run ({why}; {fix}); CI=true makes it a failure")
    if missing:
        print(f"make {target}: {len(missing)} prerequisite(s) missing; nothing started.")
        return 1
    return 0


def _rows() -> list:
    """The jobs of ``build/job-times.tsv``, as :func:`timed.read` gives them."""
    return timed.read(JOB_TIMES)


def job_times() -> list:
    """Lines of a table of ``build/job-times.tsv`` (``dev/timed.py``), longest job first."""
    rows = sorted(_rows(), key=lambda r: -r[1])
    if not rows:
        return []
    out = [
        f"{'job':<22} {'wall':>12}  {'CPU (user + system)':>19}  exit  {'CPU, every process':>18}"
    ]
    for name, wall, cpu, code, every in rows:
        shown = "-" if every is None else f"{every} s"
        out.append(
            f"{name:<22} {wall // 60:>2} min {wall % 60:>2} s  {cpu:>17} s  {code:>4}  {shown:>18}"
        )
    counted = [r[4] for r in rows if r[4] is not None]
    total = f"{sum(counted)} s" if len(counted) == len(rows) else "-"
    out.append(f"{'all jobs':<22} {'':>12}  {sum(r[2] for r in rows):>17} s  {'':>4}  {total:>18}")
    return out


def summary(target: str, status: int = 0) -> int:
    """Prints the job table and what did not run; returns ``status``, the exit status
    of the jobs' make (the summary is printed after a failure too: where the time
    went and which jobs failed matter most then)."""
    for line in job_times():
        print(line)
    lines = NOT_RUN.read_text().splitlines() if NOT_RUN.exists() else []
    if status:
        failed = [cells[0] for cells in _rows() if cells[3] != 0]
        print(
            f"make {target}: FAILED (exit {status}); failed jobs: "
            + (", ".join(failed) if failed else "none recorded (see the output above)")
        )
    elif not lines:
        print(f"make {target}: passed; every part ran.")
        return 0
    else:
        print(f"make {target}: passed, but {len(lines)} part(s) did NOT run:")
    for line in lines:
        part, _, why = line.partition("\t")
        print(f"  NOT RUN  {part}: {why}")
    return status


def main(argv: list) -> int:
    if len(argv) == 2 and argv[1] in ("demo", "check", "test"):
        return check(argv[1])
    if len(argv) in (3, 4) and argv[1] == "summary":
        return summary(argv[2], int(argv[3]) if len(argv) == 4 else 0)
    print(__doc__.strip().splitlines()[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
