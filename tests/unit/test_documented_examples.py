"""The documents' code runs as written.

* Every fenced ``python`` block that ``README.md`` or a page under ``docs/`` marks with
  the line ``<!-- runs -->`` just above it runs as a script, in a fresh process whose
  working directory is an empty temporary folder, and must exit with 0
  (``docs/development.md``, "Runnable blocks", defines the mark).
* The README's install commands run as written: ``make wheel`` is what ``make test``
  runs before this suite, and its ``pip install`` line installs the very file it names
  into a new virtualenv, from which the package then imports.
* The example in ``tf_failure_handling.testing``'s docstring runs.

The code is taken from the documents themselves, so an example that stops working
fails here instead of misleading a reader. (The README's Quickstart is run by
``tests/compat/test_quickstart.py``, preempted and resumed; the complete scripts behind
the docs' excerpts are ``examples/``, run by ``tests/examples``.)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import textwrap
import venv
from pathlib import Path

import pytest
from compat.test_quickstart import RUN_TIMEOUT_S as BLOCK_BOUND
from compat.test_quickstart import run_script
from integration.mwms_worker import child_environment
from tf_failure_handling import testing

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
RUNS = "<!-- runs -->"


def runnable_blocks() -> list:
    """(document, line of the block's first code line, code) for every marked block."""
    blocks = []
    for path in DOCUMENTS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != RUNS:
                continue
            fence = lines[i + 1] if i + 1 < len(lines) else ""
            assert fence.strip() == "```python", (
                f"{path.relative_to(ROOT)}:{i + 1}: {RUNS} must be followed by a ```python fence"
            )
            end = lines.index("```", i + 2)
            blocks.append((path.relative_to(ROOT), i + 3, "\n".join(lines[i + 2 : end]) + "\n"))
    return blocks


BLOCKS = runnable_blocks()


def test_the_documents_mark_runnable_blocks():
    """A mark the collector stopped seeing would pass every block vacuously."""
    marked = {str(path) for path, _, _ in BLOCKS}
    assert {"docs/getting-started/testing.md", "docs/getting-started/index.md"} <= marked
    mark_like = re.compile(r"^\s*<!--\s*runs\b.*-->\s*$", re.M)  # a mark, maybe misspelt
    assert sum(len(mark_like.findall(path.read_text())) for path in DOCUMENTS) == len(BLOCKS)


@pytest.mark.timeout(BLOCK_BOUND + 30)
@pytest.mark.parametrize(
    "document,line,code", BLOCKS, ids=[f"{path}:{line}" for path, line, _ in BLOCKS]
)
def test_marked_block_runs(document, line, code, tmp_path):
    assert "--8<--" not in code, "a runnable block must hold its code, not include it"
    done = run_script(code, tmp_path)  # as the Quickstart's test runs it
    assert done.returncode == 0, (
        f"{document}:{line} exited with {done.returncode}\n{done.stdout}{done.stderr[-3000:]}"
    )


def readme_section(name: str) -> str:
    """The README's text between its ``--8<-- [start:name]`` and ``[end:name]`` lines."""
    text = README.read_text()
    start = re.search(rf"^.*--8<-- \[start:{name}\].*$", text, re.M)
    end = re.search(rf"^.*--8<-- \[end:{name}\].*$", text, re.M)
    assert start and end, f"README: no section {name!r}"
    return text[start.end() : end.start()]


def install_commands() -> list[str]:
    section = readme_section("install")
    body = section[section.index("```sh\n") + len("```sh\n") : section.rindex("```")]
    return [line.split("#")[0].strip() for line in body.splitlines() if line.strip()]


@pytest.mark.timeout(600)
def test_readme_install_commands_work_as_written(tmp_path):
    """``make wheel``, then the README's ``pip install`` of the file it names, in a new
    virtualenv; the package imports from there, at the wheel's version."""
    make_wheel, pip_install = install_commands()
    assert make_wheel == "make wheel"
    # make test builds the wheel: its first phase runs test-build (under dev/timed.py),
    # whose recipe makes `wheel`. A rule is its line and recipe, up to a blank line.
    makefile = (ROOT / "Makefile").read_text()

    def rule(name: str) -> list[str]:
        found = re.search(rf"^{re.escape(name)}:(.*?)\n\n", makefile, re.M | re.S)
        assert found, f"Makefile: no rule {name!r}"
        return found.group(1).split()

    assert "timed-test-build" in rule("test"), "make test runs test-build"
    assert "wheel" in rule("test-build"), "test-build builds the wheel"
    words = shlex.split(pip_install)
    assert words[:2] == ["pip", "install"] and len(words) == 3, pip_install
    wheel = ROOT / words[2]
    built = sorted((ROOT / "dist").glob("tf_failure_handling-*.whl"))
    if not built:
        pytest.skip("no wheel in dist/: run `make wheel` (make test does) first")
    assert [wheel] == built, (
        f"`make wheel` made {[w.name for w in built]}; the README names {wheel.name}"
    )

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    env = {
        **child_environment(),
        "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}",
        "PIP_NO_INDEX": "1",  # nothing to download: the wheel has no required dependencies
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        pip_install, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    show = "import tf_failure_handling as t; print(t.__version__); print(t.__file__)"
    done = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", show],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    version, location = done.stdout.split()
    assert wheel.name.startswith(f"tf_failure_handling-{version}-")
    assert Path(location).is_relative_to(env_dir), location


def docstring_example(doc: str) -> str:
    """The indented block after ``Example::`` in a docstring."""
    block = doc[doc.index("Example::") + len("Example::") :]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


#: The SimulatedCluster timeout the docstring example runs with: the default (None, the
#: core's bound, as a cluster made without one resolves it).
EXAMPLE_CLUSTER_TIMEOUT = testing.SimulatedCluster(1).timeout


# Backstop above its own bounds in sequence: the example's two cluster runs (+ 30 s).
@pytest.mark.timeout(2 * EXAMPLE_CLUSTER_TIMEOUT + 30)
def test_testing_module_docstring_example(tmp_path):
    code = docstring_example(testing.__doc__)
    assert "assert {r.value for r in second} == {300.0}" in code
    exec(compile(code, "testing.py", "exec"), {"tmp_path": tmp_path})
