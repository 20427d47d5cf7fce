# ruff: noqa: RUF001, RUF002 - the en dash, micro and multiplication signs of the pages are what is matched
"""No hand-typed figure in any Markdown file of the repository (issues 27 and 34).

Every measured figure a reader sees must be a cell of a table ``make figures`` writes
to ``docs/figures/`` (``benches/figures.py``; each names its command, commit, date and
machine). Pages show those tables by including the files (``--8<--``); what is checked
here is what is typed into the pages themselves: the prose, the tables, and the
program output shown in ``text``/``console`` blocks.

A *figure* is a number with a unit: ns, µs (us), ms, s (seconds), min (minutes),
``40 min 46 s``, %, × (or ``12x``), closures/s, calls/s, steps/s, and ranges of them
(``23–40×``). A figure is backed when it is a whole figure of a cell of a generated
table (``15 µs`` is not backed by ``115 µs``), and of the right table:

- the tables included in the same section of the page (from one heading to the next),
  when it includes any; otherwise every table;
- a row of a table typed into a page takes all its figures from one row of one
  generated table.

The README's speed table (between ``headline.BEGIN`` and ``headline.END``) is left out
here: it is compared whole with what ``benches/headline.py`` builds from the tables.

A number with a unit that is not a measurement (a constant of the package, a bench's
setting, a cloud's grace period) is exempted where it is stated, by a comment in the
same paragraph or table, or alone in the block just above it::

    <!-- constant 300 s: "DEFAULT_PEER_TIMEOUT = 300.0" in python/tf_failure_handling/handler.py -->

The quoted text must be in that file (a path under ``tensorflow/`` is read from the
installed TensorFlow), a number in it must be the figure's value (in the figure's unit
or in seconds: ``1 ms`` and ``time.sleep(0.001)``), and the figure must be in the
block: an exemption that exempts nothing fails too.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"

_NUM = r"\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUM}(?:\s?[–-]\s?{_NUM})?"
_END = r"(?![\w/])"
FIGURE = re.compile(
    rf"""(?<![\w.\-–/])(
        \d+\s?min(?:utes?)?\s\d+\s?s{_END}            # 40 min 46 s
      | {_NUM}[kM]?\s?(?:closures|calls|steps)/s      # rates
      | {_RANGE}\s?×                                  # ratios
      | {_RANGE}x(?![\w])                              # ratios typed 12x
      | {_RANGE}\s?(?:ns|µs|us|ms){_END}              # below a second
      | {_RANGE}\s(?:seconds?|sec|s|minutes?|min|hours?){_END}  # 30 s (not 500s)
      | \d+\.\d+(?:\s?[–-]\s?\d+\.\d+)?s{_END}        # 0.5s
      | {_RANGE}\s?%                                  # percentages
    )""",
    re.X,
)
_UNIT_WORDS = {
    "us": "µs",
    "seconds": "s",
    "second": "s",
    "sec": "s",
    "minutes": "min",
    "minute": "min",
    "hours": "h",
    "hour": "h",
}
SECONDS = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}

#: ``<!-- constant FIGURE: "TEXT" in PATH -->`` (or 'TEXT'; quotes, not backticks:
#: Markdown would read backticks inside an inline comment as code)
CONSTANT = re.compile(
    r"""<!--\s*constant\s+(?P<figure>[^:]+?):\s*(?P<q>["'])(?P<text>.+?)(?P=q)\s+in\s+(?P<path>\S+)\s*-->"""
)
INCLUDE = re.compile(r'^\s*--8<--\s+"docs/figures/(?P<name>[^"]+\.md)"')
FENCE = re.compile(r"^\s*(```+|~~~+)\s*(?P<info>[\w-]*)")
#: Fenced blocks that show what a program printed: read as figures.
OUTPUT_BLOCKS = {"text", "console", "output"}


def normal(figure: str) -> str:
    """One spelling per figure: ``15 us`` -> ``15 µs``, ``2 minutes`` -> ``2 min``,
    ``12x`` -> ``12×``, ``2-3 min`` -> ``2–3 min``, ``3,000`` -> ``3000``."""
    f = re.sub(r"\s+", " ", figure.strip())
    f = re.sub(r"(?<=\d),(?=\d{3})", "", f)
    f = re.sub(r"(?<=\d)\s?[–-]\s?(?=\d)", "–", f)
    f = re.sub(r"(?<=\d)\s?x$", "×", f)
    f = re.sub(r"(?<=\d)\s?(×|%)", r"\1", f)
    f = re.sub(r"\b(us|seconds?|sec|minutes?|hours?)$", lambda m: _UNIT_WORDS[m.group(1)], f)
    f = re.sub(r"\b(minutes?)(?= \d)", "min", f)
    return re.sub(r"(?<=\d)(ns|µs|ms|s|min|h)$", r" \1", f)


def figures_in(text: str) -> list:
    return [normal(m.group(1)) for m in FIGURE.finditer(text)]


def value(figure: str) -> tuple:
    """The figure's number(s) as written and, for a duration, in seconds."""
    figure = normal(figure)
    compound = re.fullmatch(r"(\d+) min (\d+) s", figure)
    if compound:
        seconds = int(compound.group(1)) * 60 + int(compound.group(2))
        return (float(seconds),), float(seconds)
    numbers = tuple(float(n) for n in re.findall(r"\d+(?:\.\d+)?", figure))
    unit = figure.split(" ")[-1]
    seconds = numbers[0] * SECONDS[unit] if unit in SECONDS and len(numbers) == 1 else None
    return numbers, seconds


# --- the generated tables ------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    table: str  # the file's name in docs/figures
    row: str  # the row's first cell, or the line that is not a table row
    figure: str


def _cells(row: str) -> list:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def read_table(name: str, text: str) -> list:
    """Every figure of a generated file, with the row it is in."""
    found = []
    for line in text.splitlines():
        if line.startswith("*Printed by") or re.fullmatch(r"\|[\s|:-]*\|", line.strip()):
            continue
        if line.lstrip().startswith("|"):
            cells = _cells(line)
            label, cells = cells[0], cells
        else:
            label, cells = line.strip()[:80], [line]
        found += [Cell(name, label, f) for cell in cells for f in figures_in(cell)]
    return found


def generated(folder: Path = FIGURES) -> dict:
    """``{file name: [Cell, ...]}`` for every table ``make figures`` wrote."""
    return {p.name: read_table(p.name, p.read_text()) for p in sorted(folder.glob("*.md"))}


# --- the pages -----------------------------------------------------------------------


@dataclass
class Block:
    """A paragraph, a table or an output block of a page, in its section."""

    start: int  # 1-based line of its first line
    lines: list
    section: int
    table: bool = False


@dataclass
class Page:
    path: str
    blocks: list
    includes: dict  # section -> [file names in docs/figures]


def read_page(path: str, text: str, skip: tuple = ()) -> Page:
    """The page's blocks (code blocks other than program output, inline code and the
    lines between a ``skip`` pair of markers left out) and what each section includes."""
    blocks, includes, section = [], {0: []}, 0
    current = None
    fence = None
    skipping = False

    def close():
        nonlocal current
        if current is not None and current.lines:
            blocks.append(current)
        current = None

    for n, line in enumerate(text.splitlines(), 1):
        if fence is not None:
            if re.match(rf"^\s*{re.escape(fence[0])}\s*$", line):
                fence = None
                close()
            elif fence[1]:
                current = current or Block(n, [], section)
                current.lines.append((n, line))
            continue
        opened = FENCE.match(line)
        if opened:
            close()
            fence = (opened.group(1), opened.group("info") in OUTPUT_BLOCKS)
            continue
        if skip and skip[0] in line:
            skipping = True
        if skipping:
            skipping = skip[1] not in line
            continue
        if line.lstrip().startswith("#") and not line.lstrip().startswith("#!"):
            close()
            section += 1
            includes[section] = []
            continue
        include = INCLUDE.match(line)
        if include:
            includes[section].append(include.group("name"))
            continue
        if not line.strip():
            close()
            continue
        is_row = line.lstrip().startswith("|")
        if current is not None and current.table != is_row and not _only_comments(current):
            close()
        current = current or Block(n, [], section, table=is_row)
        current.table = current.table or is_row
        current.lines.append((n, line))
    close()
    return Page(path, blocks, includes)


def _only_comments(block: Block) -> bool:
    return all(not re.sub(r"<!--.*?-->", "", line).strip() for _, line in block.lines)


def _prose(line: str) -> str:
    return re.sub(r"`[^`\n]*`", "", re.sub(r"<!--.*?-->", "", line))


def pages() -> list:
    """Every Markdown file of the repository (tracked, or new and not ignored) but the
    generated tables themselves."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(p for p in set(out) if not p.startswith("docs/figures/") and (ROOT / p).exists())


# --- the check -----------------------------------------------------------------------


def _source(path: str) -> Path | None:
    if path.startswith("tensorflow/"):
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or spec.origin is None:
            return None
        return Path(spec.origin).parent.parent / path
    return ROOT / path


def check_constant(figure: str, text: str, path: str) -> str | None:
    """Why the exemption does not hold, or None."""
    source = _source(path)
    if source is None or not source.is_file():
        return f"{path} does not exist"
    if text not in source.read_text(errors="replace"):
        return f"{path} does not contain {text!r}"
    numbers, seconds = value(figure)
    stated = [
        float(n.replace("_", ""))
        for n in re.findall(r"(?<![\w.])\d[\d_]*(?:\.\d+)?(?:e-?\d+)?", text)
    ]
    wanted = set(numbers) | ({seconds} if seconds is not None else set())
    if not any(abs(s - w) <= 1e-9 * max(1.0, abs(w)) for s in stated for w in wanted):
        return f"{text!r} states none of {sorted(wanted)} (the value of {figure})"
    return None


def _describe(cells: list) -> str:
    return "; ".join(f"{c.table} row {c.row!r}" for c in cells[:3])


def check_page(page: Page, tables: dict) -> list:
    """The page's problems, one line each: ``path:line: figure: why``."""
    problems = []
    every = [c for cells in tables.values() for c in cells]
    page_includes = [n for names in page.includes.values() for n in names]
    for name in page_includes:
        if name not in tables:
            problems.append(f"{page.path}: includes docs/figures/{name}, which does not exist")
    blocks = page.blocks
    for i, block in enumerate(blocks):
        text = "\n".join(line for _, line in block.lines)
        exempt = {}
        own = [m for m in CONSTANT.finditer(text)]
        above = []
        if i and _only_comments(blocks[i - 1]):
            above = list(CONSTANT.finditer("\n".join(line for _, line in blocks[i - 1].lines)))
        if _only_comments(block):
            continue  # its exemptions are for the next block
        for m in own + above:
            figure = normal(m.group("figure"))
            why = check_constant(figure, m.group("text"), m.group("path"))
            line = block.start if m in own else blocks[i - 1].start
            if why:
                problems.append(f"{page.path}:{line}: constant {figure}: {why}")
            exempt[figure] = line
        stated = [(n, f) for n, line in block.lines for f in figures_in(_prose(line))]
        for figure, line in exempt.items():
            if figure not in {f for _, f in stated}:
                problems.append(
                    f"{page.path}:{line}: constant {figure}: the paragraph or table it is "
                    "stated for does not state it (a stale exemption)"
                )
        names = page.includes.get(block.section) or list(tables)
        scope = [c for name in names for c in tables.get(name, [])]
        where = "this section's tables" if page.includes.get(block.section) else "any table"
        rows = {}
        for n, figure in stated:
            if figure in exempt:
                continue
            backing = [c for c in scope if c.figure == figure]
            if backing:
                rows.setdefault(n, []).append((figure, {(c.table, c.row) for c in backing}))
                continue
            elsewhere = [c for c in every if c.figure == figure]
            if elsewhere:
                why = f"not in {where} ({', '.join(names)}); it is in {_describe(elsewhere)}"
            else:
                near = _nearest(figure, scope)
                why = f"no cell of {where} holds it" + (f" (the nearest: {near})" if near else "")
            problems.append(
                f"{page.path}:{n}: {figure}: {why}. Correct it to the table's figure, include "
                "the table that has it in this section, or state the constant it is "
                '(<!-- constant FIGURE: "TEXT" in PATH -->)'
            )
        if block.table:
            for n, found in rows.items():
                common = set.intersection(*(r for _, r in found))
                if len(found) > 1 and not common:
                    problems.append(
                        f"{page.path}:{n}: the figures of this row "
                        f"({', '.join(f for f, _ in found)}) are not from one row of a "
                        "generated table: "
                        + "; ".join(
                            f"{f} in {sorted(r)[0][0]} row {sorted(r)[0][1]!r}" for f, r in found
                        )
                    )
    return problems


def _nearest(figure: str, scope: list) -> str:
    numbers, seconds = value(figure)
    unit = figure.split(" ")[-1] if " " in figure else figure[-1]
    same = []
    for c in scope:
        n, s = value(c.figure)
        other = c.figure.split(" ")[-1] if " " in c.figure else c.figure[-1]
        if other != unit or not n or not numbers:
            continue
        a, b = (s or n[0]), (seconds or numbers[0])
        if a and b and 0.1 <= a / b <= 10:
            same.append((abs(a - b), c))
    same.sort(key=lambda t: t[0])
    return ", ".join(f"{c.figure} in {c.table} row {c.row!r}" for _, c in same[:2])


def _headline():
    sys.path.insert(0, str(ROOT / "benches"))
    try:
        import headline
    finally:
        sys.path.remove(str(ROOT / "benches"))
    return headline


# --- the tests -----------------------------------------------------------------------


def test_the_figure_pattern_finds_measurements_and_skips_other_numbers():
    text = (
        "TF takes 2.30 µs, ours 115 ns: **39×** less (28-95×); 6.1M closures/s; 12x; "
        "0.833 s vs 0.020 s, 30 s by default, 2 minutes, 40 min 46 s, 6%, 0.5s. HTTP 500s, "
        "Python 3.11, TF 2.21, step 42, 0x1f, x86, 64 KiB, 3,000 closures."
    )
    assert figures_in(text) == [
        "2.30 µs",
        "115 ns",
        "39×",
        "28–95×",
        "6.1M closures/s",
        "12×",
        "0.833 s",
        "0.020 s",
        "30 s",
        "2 min",
        "40 min 46 s",
        "6%",
        "0.5 s",
    ]


def _check(page_text: str, tables: dict) -> list:
    return check_page(read_page("page.md", page_text), tables)


def test_a_figure_is_backed_by_a_whole_figure_of_a_cell_not_a_substring():
    tables = {"t.md": read_table("t.md", "| | ours |\n| --- | --- |\n| dispatch | 115 µs |\n")}
    assert _check("Dispatch takes 115 µs.\n", tables) == []
    problems = _check("Dispatch takes 15 µs.\n", tables)
    assert len(problems) == 1 and problems[0].startswith("page.md:1: 15 µs: no cell")
    assert "115 µs in t.md row 'dispatch'" in problems[0]


def test_a_figure_must_be_in_the_tables_its_section_includes():
    tables = {
        "a.md": read_table("a.md", "| | x |\n| --- | --- |\n| a | 5.0 ms |\n"),
        "b.md": read_table("b.md", "| | x |\n| --- | --- |\n| b | 7.0 ms |\n"),
    }
    page = (
        '## A\n\n--8<-- "docs/figures/a.md"\n\nA takes 7.0 ms.\n\n'
        '## B\n\n--8<-- "docs/figures/b.md"\n'
    )
    (problem,) = _check(page, tables)
    assert problem.startswith("page.md:5: 7.0 ms: not in this section's tables (a.md)")
    assert "b.md row 'b'" in problem


def test_a_typed_table_row_takes_its_figures_from_one_generated_row():
    tables = {
        "t.md": read_table(
            "t.md",
            "| | TF | ours |\n| --- | --- | --- |\n| a | 1 ms | 2 ms |\n| b | 3 ms | 4 ms |\n",
        )
    }
    assert _check("| | TF | ours |\n| --- | --- | --- |\n| a | 1 ms | 2 ms |\n", tables) == []
    (problem,) = _check("| | TF | ours |\n| --- | --- | --- |\n| a | 1 ms | 4 ms |\n", tables)
    assert problem.startswith(
        "page.md:3: the figures of this row (1 ms, 4 ms) are not from one row"
    )


def test_integer_seconds_minutes_and_percentages_are_checked():
    tables = {"t.md": read_table("t.md", "| | x |\n| --- | --- |\n| a | 2 min |\n")}
    problems = _check("It waits 30 s, 3 minutes, and 50% of the time; 2 minutes.\n", tables)
    assert [p.split(": ")[1] for p in problems] == ["30 s", "3 min", "50%"]


def test_a_constant_is_exempted_by_its_value_in_the_named_file():
    tables = {"t.md": []}
    path = "src/ps_control.rs"
    good = f'It polls every 0.5 s.<!-- constant 0.5 s: "POLL_INTERVAL: f64 = 0.5" in {path} -->\n'
    assert _check(good, tables) == []
    # alone in the block above the table or paragraph it is for
    above = f'<!-- constant 0.5 s: "POLL_INTERVAL: f64 = 0.5" in {path} -->\n\n| a | 0.5 s |\n'
    assert _check(above, tables) == []
    # the text is not in the file
    (problem,) = _check(
        good.replace("POLL_INTERVAL: f64 = 0.5", "POLL_INTERVAL: f64 = 0.25"), tables
    )
    assert "does not contain 'POLL_INTERVAL: f64 = 0.25'" in problem
    # the text is in the file but does not state the figure's value
    (problem,) = _check(good.replace("0.5 s", "0.7 s"), tables)
    assert "states none of [0.7]" in problem
    # the file does not exist
    (problem,) = _check(good.replace(path, "python/nowhere.py"), tables)
    assert "python/nowhere.py does not exist" in problem
    # an exemption for a figure its paragraph does not state
    (problem,) = _check(good.replace("every 0.5 s", "often"), tables)
    assert "a stale exemption" in problem
    # it exempts its own paragraph only
    (problem,) = _check(good + "\nAnd waits 0.5 s.\n", tables)
    assert problem.startswith("page.md:3: 0.5 s: no cell")


def test_a_duration_constant_may_be_stated_in_seconds_in_the_code():
    assert check_constant("1 ms", "time.sleep(0.001)", "benches/bench_records.py") is None
    assert check_constant("30 ms", "STEP_SLEEP = 0.03", "benches/bench_notice.py") is None
    assert check_constant("2 min", "AWS_GRACE_PERIOD: u32 = 120", "src/sources/aws.rs") is None


def test_program_output_blocks_are_read_and_code_blocks_are_not():
    tables = {"t.md": []}
    assert _check("```sh\nsleep 5  # ~10 s\n```\n", tables) == []
    (problem,) = _check("```text\nsaved in 0.07 s\n```\n", tables)
    assert problem.startswith("page.md:2: 0.07 s: no cell")


def test_every_markdown_file_of_the_repository_is_read():
    read = pages()
    for path in ("README.md", "examples/README.md", "demo/README.md", "docs/index.md"):
        assert path in read
    assert not [p for p in read if p.startswith("docs/figures/")]


def test_generated_tables_name_their_command_commit_and_machine():
    tables = sorted(FIGURES.glob("*.md"))
    assert tables, f"no tables in {FIGURES}: run `make figures`"
    for path in tables:
        text = path.read_text()
        assert re.search(r"\*Printed by `python [^`]+` at commit `[0-9a-f]{7,}", text), path
        assert "CPUs" in text, path


@pytest.mark.parametrize("page", pages())
def test_every_figure_of_the_page_comes_from_make_figures_or_is_a_constant(page):
    headline = _headline()
    skip = (headline.BEGIN, headline.END) if page == "README.md" else ()
    problems = check_page(read_page(page, (ROOT / page).read_text(), skip), generated())
    assert not problems, "\n".join(problems)


def test_the_readme_speed_table_is_the_one_make_figures_builds():
    """The README's speed table, row by row, is what ``benches/headline.py`` builds from
    the tables in ``docs/figures`` (``make figures`` rewrites it after every run)."""
    headline = _headline()
    readme = (ROOT / "README.md").read_text()
    start = readme.index(headline.BEGIN) + len(headline.BEGIN)
    assert readme[start : readme.index(headline.END)].strip() == headline.table(FIGURES)
