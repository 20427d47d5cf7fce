"""``dev/prereqs.py``: what ``make demo``, ``make check`` and ``make test`` check before
anything starts, and what ``make test`` says at its end about the parts that did not run.

The machine is described to the script through its own lookups (``shutil.which``,
``os.geteuid``, ``pyenv_has``, the ``rustc --version`` it runs), so each case is a
machine the test describes, whatever this one has."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# dev/prereqs.py imports its neighbour dev/timed.py, as it does when run as a script.
sys.path.insert(0, str(ROOT / "dev"))


@pytest.fixture
def prereqs(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "dev_prereqs_machine", ROOT / "dev" / "prereqs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.NOT_RUN = tmp_path / "not-run.txt"
    module.JOB_TIMES = tmp_path / "job-times.tsv"
    monkeypatch.delenv("CI", raising=False)
    return module


def machine(monkeypatch, prereqs, *, without=(), root=True, pyenv=("3.10", "3.13")):
    """A machine with every program the script looks for but ``without`` those, (not)
    root, and with only the ``pyenv`` CPythons; nothing of this machine shows through
    (the compatibility ends run these tests with no Rust on the PATH)."""
    monkeypatch.setattr(
        prereqs.shutil, "which", lambda name: None if name in without else f"/usr/bin/{name}"
    )
    rustc = ".".join(map(str, prereqs.rust_version_needed() or (1, 0)))
    answers = {("rustc", "--version"): f"rustc {rustc} (described by the test)\n"}
    monkeypatch.setattr(prereqs, "_run", lambda *argv: answers.get(argv, ""))
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(prereqs, "pyenv_has", lambda version: version in pyenv)


def test_a_missing_rust_is_one_line_with_rustup_and_nothing_starts(prereqs, monkeypatch, capsys):
    machine(monkeypatch, prereqs, without=("cargo",))
    assert prereqs.check("demo") == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"make demo: missing Rust (cargo, rustc). Install: {prereqs.RUSTUP}",
        "make demo: 1 prerequisite(s) missing; nothing started.",
    ]


def test_a_rust_older_than_the_crate_needs_names_rustup_update(prereqs, monkeypatch, capsys):
    machine(monkeypatch, prereqs)
    monkeypatch.setattr(prereqs, "_run", lambda *argv: "rustc 1.63.0 (Debian's)\n")
    assert prereqs.check("check") == 1
    needed = ".".join(map(str, prereqs.rust_version_needed()))
    out = capsys.readouterr().out
    assert f"missing Rust >= {needed} (found rustc 1.63.0 (Debian's)). " in out, out
    assert "Install: rustup update stable" in out, out


def test_a_missing_c_toolchain_names_build_essential(prereqs, monkeypatch, capsys):
    machine(monkeypatch, prereqs, without=("cc", "gcc"))
    assert prereqs.check("check") == 1
    assert "Install: apt-get install build-essential" in capsys.readouterr().out


def test_outside_ci_a_part_that_cannot_run_is_named_at_the_start_and_at_the_end(
    prereqs, monkeypatch, capsys
):
    machine(monkeypatch, prereqs, root=False, pyenv=("3.10",))
    assert prereqs.check("test") == 0
    start = capsys.readouterr().out
    for part in ("slurm-suite", "netns", "compat-ends"):
        assert f"make test: {part} will not run (" in start, start
    assert "pyenv install 3.13" in start and "CI=true makes it a failure" in start
    # The Makefile skips the jobs named in NOT_RUN; the summary lists them, never a
    # silent green.
    assert prereqs.summary("test") == 0
    end = capsys.readouterr().out.splitlines()
    assert end[0] == "make test: passed, but 3 part(s) did NOT run:"
    assert [line.split()[2].rstrip(":") for line in end[1:]] == [
        "slurm-suite",
        "netns",
        "compat-ends",
    ]


def test_under_ci_a_part_that_cannot_run_is_a_missing_prerequisite(prereqs, monkeypatch, capsys):
    monkeypatch.setenv("CI", "true")
    machine(monkeypatch, prereqs, pyenv=())
    assert prereqs.check("test") == 1
    out = capsys.readouterr().out
    assert "missing what compat-ends needs under CI=true (no pyenv CPython 3.10, 3.13)" in out
    assert out.rstrip().endswith("nothing started.")
    assert prereqs.NOT_RUN.read_text() == ""


def test_only_make_test_has_parts_that_may_not_run(prereqs, monkeypatch, capsys):
    machine(monkeypatch, prereqs, root=False, pyenv=())
    assert prereqs.check("demo") == 0 and prereqs.check("check") == 0
    assert capsys.readouterr().out == ""
    assert prereqs.NOT_RUN.read_text() == ""


def test_a_machine_with_everything_ends_with_every_part_ran(prereqs, monkeypatch, capsys):
    machine(monkeypatch, prereqs)
    assert prereqs.check("test") == 0
    assert prereqs.summary("test") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "make test: passed; every part ran."


def test_a_failed_run_still_lists_what_did_not_run_and_keeps_its_status(
    prereqs, monkeypatch, capsys
):
    machine(monkeypatch, prereqs, pyenv=("3.13",))
    assert prereqs.check("test") == 0
    capsys.readouterr()
    assert prereqs.summary("test", 2) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("make test: FAILED (exit 2)")
    assert out[1].startswith("  NOT RUN  compat-ends: no pyenv CPython 3.10")
