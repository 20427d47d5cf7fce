"""The imports of the package, of the Rust core (``src``) and of its binding
(``src/python``) form no cycle, and none runs from a lower layer to a higher one.

A graph without a cycle is layered: each module sits above everything it imports, so
no import runs back up. The graphs are read from the sources as text, without
importing anything:

* the package: every ``import`` and ``from ... import`` of each module, those inside
  functions too (a lazy import is an import all the same); ``_native`` is the binding,
  below every module;
* ``src``: every path a file names from ``crate::``, ``super::`` or ``self::`` (``use``
  lines, their ``{...}`` groups and paths written inline), resolved to the longest module
  that exists; tests are left out (``#[cfg(test)]`` modules and what follows such a
  ``mod tests``);
* the core never names the binding (``crate::python``): the binding is above it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "tf_failure_handling"
SRC = ROOT / "src"


def cycles(edges: set) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative)."""
    graph: dict = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# ------------------------------------------------------------------ the package


def package_modules() -> dict:
    """Dotted name -> file, for every module of the package."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def package_edges(modules: dict) -> set:
    """(importer, imported) for every import of a module of the package by another."""
    edges = set()
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    # A submodule, else a name the module defines (its own file).
                    targets.append(sub if sub in modules or alias.name == "_native" else module)
            for target in targets:
                if target.split(".")[-1] == "_native":
                    continue  # the binding: below every module
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add((name, target))
    return edges


def test_the_package_imports_form_no_cycle():
    modules = package_modules()
    edges = package_edges(modules)
    assert len(modules) > 50 and len(edges) > 100, (len(modules), len(edges))
    assert cycles(edges) == []


# ------------------------------------------------------------------ src and src/python

#: A module declared for tests only: ``#[cfg(test)] mod name;``.
TEST_ONLY_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
#: Where a file's tests start: ``#[cfg(test)]`` before an inline ``mod ... {``.
TESTS_START = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
PATH = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_]\w*)+)")
GROUP = re.compile(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^;]*)\}", re.S)


def rust_modules() -> dict:
    """``crate::a::b`` -> file, for every module of ``src`` that is not for tests only."""
    modules = {}
    for path in SRC.rglob("*.rs"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        modules["::".join(["crate", *parts])] = path
    test_only = set()
    for name, path in modules.items():
        for m in TEST_ONLY_MOD.finditer(path.read_text()):
            test_only.add(f"{name}::{m.group(1)}")
    return {
        n: p
        for n, p in modules.items()
        if not any(n == t or n.startswith(t + "::") for t in test_only)
    }


def _code(path: Path) -> str:
    """The file without its comments and its tests."""
    text = path.read_text()
    start = TESTS_START.search(text)
    if start:
        text = text[: start.start()]
    return re.sub(r"//[^\n]*", "", text)


def rust_edges(modules: dict) -> set:
    """(module, module it names) for every path a module names in another."""
    edges = set()
    for name, path in modules.items():
        here = name.split("::")
        text = _code(path)
        paths = [m.group(1) for m in PATH.finditer(text)]
        for group in GROUP.finditer(text):
            for item in group.group(2).split(","):
                item = item.split(" as ")[0].strip()
                if item and item != "self" and re.fullmatch(r"\w+(::\w+)*", item):
                    paths.append(f"{group.group(1)}::{item}")
        for named in paths:
            parts = named.split("::")
            if parts[0] == "crate":
                full = parts
            else:
                full = list(here)
                while parts and parts[0] in ("super", "self"):
                    if parts.pop(0) == "super":
                        full.pop()
                full += parts
            while full and "::".join(full) not in modules:
                full.pop()
            target = "::".join(full)
            # A module names its parent (super::) or its own children: not an import
            # of another layer when it is its own ancestor.
            if target and target != name and not name.startswith(target + "::"):
                edges.add((name, target))
    return edges


def test_src_and_the_binding_form_no_cycle_and_the_core_never_names_the_binding():
    modules = rust_modules()
    edges = rust_edges(modules)
    assert len(modules) > 50 and len(edges) > 100, (len(modules), len(edges))
    core = {(a, b) for a, b in edges if not a.startswith("crate::python")}
    binding = {
        (a, b) for a, b in edges if a.startswith("crate::python") and b.startswith("crate::python")
    }
    assert cycles(core) == []
    assert cycles(binding) == []
    upward = sorted(
        (a, b) for a, b in core if b == "crate::python" or b.startswith("crate::python::")
    )
    assert upward == [], "the core names the binding"


def test_a_cycle_is_found():
    """The check itself: a cycle of three, one of two beside it, and a chain."""
    edges = {("a", "b"), ("b", "c"), ("c", "a"), ("d", "e"), ("e", "d"), ("f", "g")}
    assert sorted(cycles(edges)) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({("f", "g"), ("g", "h")}) == []
