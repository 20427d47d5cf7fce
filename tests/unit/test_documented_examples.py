"""The examples in the README and in ``tf_failure_handling.testing`` run as written.

The code is taken from the documents themselves, so an example that stops
working fails here instead of misleading a reader.
"""

import pathlib
import textwrap

import pytest
from tf_failure_handling import testing

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    text = README.read_text()
    after = text[text.index(heading) :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("```", start)]


def docstring_example(doc: str) -> str:
    """The indented block after ``Example::`` in a docstring."""
    block = doc[doc.index("Example::") + len("Example::") :]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


@pytest.mark.timeout(60)
def test_readme_testing_example(tmp_path):
    code = readme_block("### Testing your own loop without a cluster")
    assert "cluster.run(worker)" in code
    exec(compile(code, "README.md", "exec"), {"tmp_path": tmp_path})


@pytest.mark.timeout(60)
def test_testing_module_docstring_example(tmp_path):
    code = docstring_example(testing.__doc__)
    assert "assert {r.value for r in second} == {300.0}" in code
    exec(compile(code, "testing.py", "exec"), {"tmp_path": tmp_path})
