"""``python -m tf_failure_handling report PATH``: see :mod:`tf_failure_handling.report`."""

from __future__ import annotations

import sys


def main(argv: list) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] != "report":
        print("usage: python -m tf_failure_handling report PATH [--json] [--plot FILE]")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from .report import main as report

    return report(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
