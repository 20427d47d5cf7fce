"""Where the protocol's decisions live: the measures of issue 51, each with every place
it counts, so that a change can be checked against them.

    python3 dev/protocol_measures.py [--list] [--json]

* **Policy values in Python**: a number given to a name (a module or class constant,
  a parameter's default, a keyword argument) whose name says it is a duration or a
  bound: timeout, bound, interval, grace, wait, delay, slack, period, deadline,
  reserve, poll, backoff, seconds, margin. A name imported from ``_native`` is the
  core's value, not counted.
* **Clock reads and sleeps in Python**: uses of ``time.monotonic``, ``time.time``,
  ``time.perf_counter`` (and their ``_ns`` forms) and ``time.sleep`` (a call, or the
  function passed on as a clock to be called later), outside
  ``testing.py``, ``records.py`` and ``report.py`` (where a wall-clock timestamp is the
  point).
* **Clocks in the binding**: ``Instant::now``, ``SystemTime::now`` and ``clock_gettime``
  in ``src/python``.
* **Python files over 500 lines**.
* **Constructors taking more than 4 parts**: an ``__init__`` whose parameters annotated
  with a class (a capitalised name that is not a ``typing`` form or a value type such as
  ``Path`` or ``Event``) number more than 4. A function (``Callable``) is not a part; a
  handler part's ``Context`` (state, core, error reports, stage records, passed as one)
  counts as one.

Reads the sources only (``ast`` for Python, text for Rust); imports nothing of the
package. ``--list`` prints every place counted; ``--json`` one object of the counts.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "tf_failure_handling"
BINDING = ROOT / "src" / "python"

#: A name that says its value is a duration or a bound.
_POLICY_NAME = re.compile(
    r"timeout|bound|interval|grace|wait|delay|slack|period|deadline|reserve|poll|"
    r"backoff|seconds|margin|slice|every|window|look|settle|slow|_secs?$|_s$",
    re.IGNORECASE,
)
_CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "time_ns", "perf_counter_ns"}
_WALL_CLOCK_FILES = {"testing.py", "records.py", "report.py"}
_RUST_CLOCK = re.compile(r"\b(?:(?:Instant|SystemTime)::now|clock_gettime)\b")
MAX_LINES = 500
MAX_PARTS = 4
#: Annotations that name no part of the package.
_NOT_PARTS = {
    "Any", "Callable", "Optional", "Union", "Path", "Event", "Lock", "RLock", "Iterable",
    "Sequence", "Mapping", "Dict", "List", "Tuple", "Type",
}  # fmt: skip


def _is_number(node: ast.AST) -> bool:
    """A literal number, or arithmetic of literal numbers (``2 * 60``, ``-1.0``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def _target_names(node: ast.AST) -> list:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for e in node.elts for n in _target_names(e)]
    return []


def policy_values(path: Path, tree: ast.AST) -> list:
    """``(line, name)`` of each policy value given in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _is_number(node.value):
                for name in (n for t in targets for n in _target_names(t)):
                    if _POLICY_NAME.search(name):
                        found.append((node.lineno, name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if _is_number(default) and _POLICY_NAME.search(arg.arg):
                    found.append((default.lineno, f"{arg.arg}= (default)"))
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg and _is_number(kw.value) and _POLICY_NAME.search(kw.arg):
                    found.append((kw.value.lineno, f"{kw.arg}= (argument)"))
    return found


def clock_calls(tree: ast.AST) -> list:
    """``(line, name)`` of each clock read or sleep: ``time.x`` (called, or passed on as
    a clock: ``clock=time.monotonic`` reads it later), or ``x`` where ``x`` was imported
    from ``time``."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for alias in node.names
        if alias.name in _CLOCKS or alias.name == "sleep"
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "time"
            and (node.attr in _CLOCKS or node.attr == "sleep")
        ):
            found.append((node.lineno, f"time.{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in imported:
            found.append((node.lineno, node.id))
    return found


def _annotation_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(".")[-1]
    return ""


def wide_constructors(tree: ast.AST) -> list:
    """(line, class, parts) of each ``__init__`` taking more than MAX_PARTS parts."""
    found = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"):
                continue
            parts = [
                a.arg
                for a in fn.args.args[1:] + fn.args.kwonlyargs
                if (name := _annotation_name(a.annotation))[:1].isupper() and name not in _NOT_PARTS
            ]
            if len(parts) > MAX_PARTS:
                found.append((fn.lineno, cls.name, parts))
    return found


def measure() -> dict:
    places: dict = {
        "policy": [], "clock": [], "binding_clock": [], "long_files": [], "wide": []
    }  # fmt: skip
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        text = path.read_text()
        tree = ast.parse(text, str(path))
        found = sorted(policy_values(path, tree))
        places["policy"] += [f"{rel}:{n} {name}" for n, name in found]
        if path.name not in _WALL_CLOCK_FILES:
            places["clock"] += [f"{rel}:{n} {call}" for n, call in sorted(clock_calls(tree))]
        for n, cls, parts in wide_constructors(tree):
            places["wide"].append(f"{rel}:{n} {cls}({', '.join(parts)})")
        lines = text.count("\n")
        if lines > MAX_LINES:
            places["long_files"].append(f"{rel} {lines} lines")
    for path in sorted(BINDING.rglob("*.rs")):
        rel = path.relative_to(ROOT)
        for n, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("//"):
                continue
            for m in _RUST_CLOCK.finditer(line):
                places["binding_clock"].append(f"{rel}:{n} {m.group(0)}")
    return places


_TITLES = {
    "policy": "policy values (durations, bounds) defined in the Python package",
    "clock": "clock reads and sleeps in the package (outside testing, records, report)",
    "binding_clock": "clock reads in src/python",
    "long_files": f"Python files over {MAX_LINES} lines",
    "wide": f"constructors taking more than {MAX_PARTS} parts",
}


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every place counted")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    places = measure()
    if args.json:
        print(json.dumps({k: len(v) for k, v in places.items()}, sort_keys=True))
        return 0
    for key, title in _TITLES.items():
        print(f"{len(places[key]):4d}  {title}")
        if args.list:
            for place in places[key]:
                print(f"        {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
