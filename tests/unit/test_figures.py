# ruff: noqa: RUF001 - the en dash and multiplication sign of the pages are what is matched
"""No hand-typed figure in the README or the docs (issue 27).

Every measured figure a reader sees (a duration in ns, µs or ms, a ratio, a rate, a
duration in seconds with decimals) must be in the tables ``make figures`` writes to
``docs/figures/`` (``benches/figures.py``; each names its command, commit, date and
machine). Pages show those tables by including the files (``--8<--``), so what is
checked here is the prose and the tables typed into the pages themselves: a figure
there that no generated table contains was typed by hand, or is stale.

Some numbers with units are not measurements but the package's own constants (a poll
interval, a bound). Each is listed in :data:`CONSTANTS` with the module attribute it
states, and that attribute is checked to hold the value, so a documented constant
cannot drift from the code either.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"

_NUM = r"\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUM}(?:\s?[–-]\s?{_NUM})?"
FIGURE = re.compile(
    rf"""(?<![\w.\-])(
        {_RANGE}\s?(?:ns|µs|us|ms)\b             # durations below a second
      | {_RANGE}\s?×                             # ratios
      | \d+\.\d+(?:\s?[–-]\s?\d+\.\d+)?\s?s\b     # seconds with decimals
      | {_NUM}[kM]?\s?(?:closures|calls|steps)/s  # rates
    )""",
    re.X,
)

#: Numbers with units in the pages that are constants of the package, not
#: measurements: the figure as written -> (module, attribute, value in seconds).
#: The attribute is read and compared; a ``__text_signature__`` attribute is read as
#: the native function's keyword default of that name (``interval=0.5``).
CONSTANTS: dict = {
    # The parameter-server coordinator polls each PS and worker task (ClusterPoller).
    "0.5 s": ("tf_failure_handling._coordinator.ps_control", "POLL_INTERVAL", 0.5),
    # ClusterCoordinator.join() checks for a notice between slices of its wait.
    "0.2 s": ("tf_failure_handling._coordinator.ps_control", "JOIN_SLICE", 0.2),
}
#: The AWS Spot poll interval the clouds pages state as "polled every 0.5 s".
NATIVE_DEFAULTS = {"0.5 s": ("MetadataWatch", "interval", 0.5)}

#: Figures the pages give as a bench's setting, not its result: the figure as written
#: -> (the bench, the line that sets it there). The line is looked up in the file.
PARAMETERS: dict = {
    # bench_notice.py: each training step of the two MWMS workers sleeps this long.
    "30 ms": ("benches/bench_notice.py", "STEP_SLEEP = 0.03"),
    # bench_records.py: each step of the local handler's loop.
    "1 ms": ("benches/bench_records.py", "time.sleep(0.001)"),
}


def _pages() -> list:
    pages = [ROOT / "README.md"]
    docs = ROOT / "docs"
    if docs.exists():
        pages += sorted(p for p in docs.rglob("*.md") if FIGURES not in p.parents)
    return pages


def _prose(text: str) -> str:
    """The page without code blocks, inline code and comments: what is left is read
    as figures and words."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _normal(figure: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"(?<=\d)(\s?)us\b", r"\1µs", figure)).strip()


def figures_in(text: str) -> list:
    return [_normal(m.group(1)) for m in FIGURE.finditer(_prose(text))]


def _generated() -> str:
    return "\n".join(p.read_text() for p in sorted(FIGURES.glob("*.md")))


def test_the_figure_pattern_finds_measurements_and_skips_code():
    text = (
        "TF takes 2.30 µs, ours 115 ns: **39×** less (28–95×); 6.1M closures/s; "
        "0.833 s vs 0.020 s. `time.sleep(0.5 s)` and\n```\nx = 12 ms\n```\n"
        "Python 3.11, TF 2.21, 30 s by default, step 42."
    )
    assert figures_in(text) == [
        "2.30 µs",
        "115 ns",
        "39×",
        "28–95×",
        "6.1M closures/s",
        "0.833 s",
        "0.020 s",
    ]


def test_generated_tables_name_their_command_commit_and_machine():
    tables = sorted(FIGURES.glob("*.md"))
    assert tables, f"no tables in {FIGURES}: run `make figures`"
    for path in tables:
        text = path.read_text()
        assert re.search(r"\*Printed by `python [^`]+` at commit `[0-9a-f]{7,}", text), path
        assert "CPUs" in text, path


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_on_the_page_comes_from_make_figures(page):
    generated = _normal(_generated())
    typed = [f for f in figures_in(page.read_text()) if f not in CONSTANTS and f not in PARAMETERS]
    missing = sorted({f for f in typed if f not in generated})
    assert not missing, (
        f"{page.relative_to(ROOT)} states figures that no table of `make figures` "
        f"contains (typed by hand, or stale): {missing}. Include the generated table "
        '(--8<-- "docs/figures/<table>.md") or list a constant in CONSTANTS.'
    )


@pytest.mark.parametrize("figure", sorted(CONSTANTS))
def test_documented_constants_hold_in_the_code(figure):
    module, attribute, seconds = CONSTANTS[figure]
    assert getattr(importlib.import_module(module), attribute) == seconds


@pytest.mark.parametrize("figure", sorted(NATIVE_DEFAULTS))
def test_documented_native_defaults_hold_in_the_code(figure):
    from tf_failure_handling import _native

    cls, keyword, seconds = NATIVE_DEFAULTS[figure]
    signature = getattr(_native, cls).__text_signature__
    assert f"{keyword}={seconds!r}" in signature, signature
    assert figure in CONSTANTS  # a page may state it


@pytest.mark.parametrize("figure", sorted(PARAMETERS))
def test_documented_bench_settings_hold_in_the_bench(figure):
    path, line = PARAMETERS[figure]
    assert line in (ROOT / path).read_text(), f"{path} no longer has {line!r} ({figure})"


def test_the_readme_speed_table_is_the_one_make_figures_builds():
    """The README's speed table, row by row, is what ``benches/headline.py`` builds from
    the tables in ``docs/figures`` (``make figures`` rewrites it after every run)."""
    sys.path.insert(0, str(ROOT / "benches"))
    try:
        import headline
    finally:
        sys.path.remove(str(ROOT / "benches"))
    readme = (ROOT / "README.md").read_text()
    start = readme.index(headline.BEGIN) + len(headline.BEGIN)
    assert readme[start : readme.index(headline.END)].strip() == headline.table(FIGURES)
