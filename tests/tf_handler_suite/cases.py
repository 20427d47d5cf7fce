"""Which tests TensorFlow's two handler test files hold, read with ``ast`` (nothing
imported), and where the files are.

A test method decorated ``@combinations.generate(combinations.combine(k=[...], ...))``
is one test per combination, named as TF's ``combinations`` names them:
``<method>_test_<key>_<value>_...``, keys sorted, ``_`` and other characters that are
not letters or digits left out of each key and value
(``test_grace_period_continue_training_test_inputarg_manager_strategyoption_MWMSlocal``).
The runner checks that the tests a run reports are exactly these: a variant that did
not run is a failure, not a smaller total.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: Where the test files are: ``../shared/tf_tests`` beside the repository (CI has it
#: too), or ``TFH_TF_TESTS_DIR``.
TESTS_DIR_ENV = "TFH_TF_TESTS_DIR"
FILES = ("failure_handler_test.py", "gce_failure_handler_test.py")


def tests_dir() -> Path:
    return Path(os.environ.get(TESTS_DIR_ENV) or REPO.parent / "shared" / "tf_tests")


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", text)


def _combinations(decorator: ast.expr) -> list[dict] | None:
    """The combinations of ``combinations.generate(combinations.combine(...))``, or None
    for any other decorator."""
    if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("generate")):
        return None
    (combine,) = decorator.args
    if not (isinstance(combine, ast.Call) and ast.unparse(combine.func).endswith("combine")):
        raise ValueError(f"unexpected test decorator: {ast.unparse(decorator)}")
    values = {kw.arg: ast.literal_eval(kw.value) for kw in combine.keywords}
    keys = sorted(values)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(values[k] for k in keys))]


def test_names(path: Path) -> list[str]:
    """``Class.test_name`` of every test in the file, each combination its own."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for fn in node.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test")):
                continue
            combos = None
            for decorator in fn.decorator_list:
                combos = _combinations(decorator) or combos
            if combos is None:
                names.append(f"{node.name}.{fn.name}")
                continue
            for combo in combos:
                suffix = "_".join(f"{_clean(k)}_{_clean(str(v))}" for k, v in combo.items())
                names.append(f"{node.name}.{fn.name}_test_{suffix}")
    return names


def method_of(name: str) -> str:
    """The test method a test is a combination of (``test_basic_run``)."""
    method = name.split(".", 1)[-1]
    return method.split("_test_", 1)[0] if "_test_" in method else method


def steps_per_run_of_training(path: Path) -> int | None:
    """The steps one training of the file's ``worker_fn`` takes, ``EPOCHS_TO_RUN *
    STEPS_PER_EPOCH`` (module constants of both files), or None if they are not there."""
    values = {}
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("EPOCHS_TO_RUN", "STEPS_PER_EPOCH"):
                values[target.id] = ast.literal_eval(node.value)
    if len(values) != 2:
        return None
    return int(values["EPOCHS_TO_RUN"]) * int(values["STEPS_PER_EPOCH"])
