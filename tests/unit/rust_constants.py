"""Constants of the Rust core that the package no longer exports, read from Rust's
source for the tests that state what a rule's numbers are (issue 61: no constant is
exported that Python does not use)."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def rust_constant(file: str, name: str) -> float:
    """``pub const NAME: T = value;`` in ``src/<file>``, as a number."""
    text = (SRC / file).read_text()
    match = re.search(rf"pub const {name}: \w+ = ([0-9_.]+);", text)
    if match is None:
        raise LookupError(f"no `pub const {name}` in src/{file}")
    return float(match.group(1).replace("_", ""))


#: src/retry.rs: the retry rule's numbers.
RETRY_FIRST_PAUSE = rust_constant("retry.rs", "FIRST_PAUSE")
RETRY_MIN_ATTEMPTS = int(rust_constant("retry.rs", "MIN_ATTEMPTS"))
TRANSIENT_FAILURE_WINDOW = rust_constant("retry.rs", "TRANSIENT_FAILURE_WINDOW")
#: src/grace.rs: the exit's reserve and the planner's slack.
EXIT_RESERVE = rust_constant("grace.rs", "EXIT_RESERVE")
GRACE_SLACK = rust_constant("grace.rs", "SLACK")
