"""The Python package's size: every line, and the lines of code (no docstring, comment
or blank line), per folder and in all.

    python3 dev/count_lines.py [python/tf_failure_handling]
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

_SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(tree: ast.AST) -> set:
    lines: set = set()
    for node in ast.walk(tree):
        if isinstance(node, _DOCUMENTED) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def count(path: Path) -> tuple:
    """(every line, lines of code) of one file."""
    source = path.read_text()
    docs = docstring_lines(ast.parse(source))
    code: set = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _SKIPPED:
            code.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docs)
    return len(source.splitlines()), len(code)


def main(argv: list) -> int:
    root = Path(argv[1] if len(argv) > 1 else "python/tf_failure_handling")
    lines, code = Counter(), Counter()
    for path in sorted(root.rglob("*.py")):
        folder = str(path.parent.relative_to(root)) if path.parent != root else "."
        every, of_code = count(path)
        lines[folder] += every
        code[folder] += of_code
    print(f"{'folder':<16}{'lines':>8}{'code':>8}")
    for folder in sorted(lines):
        print(f"{folder:<16}{lines[folder]:>8}{code[folder]:>8}")
    print(f"{'all':<16}{sum(lines.values()):>8}{sum(code.values()):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
