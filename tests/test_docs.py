"""docs/attention.md, the tour from the equations to the code, still points at the code.

Its references read `symbol` (`file.py:N`) or (`file.py:N-M`): the lines must exist and the first
of them must hold the symbol (the code span just before the reference, or its last dotted part:
`BahdanauDecoder._recurrence` -> `def _recurrence`). Its Python excerpts must be lines of
nmt/model/ as they are, up to indentation and trailing comments.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOUR = REPO / "docs" / "attention.md"
MODEL = REPO / "nmt" / "model"

CODE_SPAN = re.compile(r"`([^`]+)`")
REFERENCE = re.compile(r"^(\w+\.py):(\d+)(?:-(\d+))?$")
SYMBOL = re.compile(r"^[A-Za-z_][\w.]*$")


def _references() -> list[tuple[str, str, int, int]]:
    """(anchor symbol, file name, first line, last line) of every reference, in order."""
    found, anchor = [], None
    prose = re.sub(r"```.*?```", "", TOUR.read_text(encoding="utf-8"), flags=re.DOTALL)   # spans, not code blocks
    for span in CODE_SPAN.findall(prose):
        match = REFERENCE.match(span)
        if match is None:
            assert ".py:" not in span, f"`{span}`: write references as `file.py:N` or `file.py:N-M`"
            anchor = span
            continue
        assert anchor is not None and SYMBOL.match(anchor), f"reference {span} follows `{anchor}`, not a symbol"
        first = int(match.group(2))
        found.append((anchor, match.group(1), first, int(match.group(3) or first)))
    return found


def _symbol(anchor: str) -> str:
    """`BahdanauDecoder._recurrence` -> `_recurrence`; `rnn.step` -> `step`."""
    return re.findall(r"\w+", anchor)[-1]


def test_the_tour_has_references():
    assert len(_references()) >= 30


@pytest.mark.parametrize(("anchor", "name", "first", "last"), _references(),
                         ids=lambda value: str(value))
def test_each_reference_holds_its_symbol(anchor, name, first, last):
    path = MODEL / name
    assert path.is_file(), f"{name}: no such file in nmt/model/"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert 1 <= first <= last <= len(lines), f"{name}:{first}-{last} is outside the file's {len(lines)} lines"
    symbol = re.compile(rf"\b{re.escape(anchor)}\b|\b{re.escape(_symbol(anchor))}\b")
    now_at = [str(number) for number, line in enumerate(lines, 1) if symbol.search(line)]
    assert symbol.search(lines[first - 1]), \
        f"`{anchor}` is not on {name}:{first}; it is on line {', '.join(now_at) or 'none'}"


def test_no_line_number_without_its_file():
    bare = re.findall(r"\blines? \d+", TOUR.read_text(encoding="utf-8"))
    assert bare == []


def _code(line: str) -> str:
    """A line without its indentation and trailing comment."""
    return line.split("  #")[0].strip()


def test_the_python_excerpts_are_the_code_as_it_is():
    source = {_code(line) for path in MODEL.glob("*.py") for line in path.read_text(encoding="utf-8").splitlines()}
    blocks = re.findall(r"```python\n(.*?)```", TOUR.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks
    missing = [line for block in blocks for line in map(_code, block.splitlines()) if line and line not in source]
    assert missing == []


def test_the_gpu_tables_are_built_from_their_results(monkeypatch):
    """docs/benchmarks.md's GPU tables are bench/gpu_table.py's output for the folder the page names."""
    from bench.gpu_table import table

    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- gpu-table: (\S+) -->\n(.*?)<!-- /gpu-table -->", page, re.S)
    assert blocks, "no gpu-table block in docs/benchmarks.md"
    monkeypatch.chdir(REPO)                                   # the page names the folder from the repository
    for folder, text in blocks:
        assert (REPO / folder).is_dir(), folder
        assert text == table(Path(folder)), f"the table of {folder} differs from bench/gpu_table.py's output"


def test_the_cpu_tables_are_built_from_their_results(monkeypatch):
    """docs/benchmarks.md's CPU tables are bench/cpu_table.py's output for the folder each block names,
    and every folder of CPU figures under docs/results/ has its block."""
    from bench.cpu_table import table

    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- cpu-table: (\S+) -->\n(.*?)<!-- /cpu-table -->", page, re.S)
    monkeypatch.chdir(REPO)
    for folder, text in blocks:
        assert text == table(Path(folder)), f"the table of {folder} differs from bench/cpu_table.py's output"
    results = REPO / "docs" / "results"
    with_figures = sorted(p.parent.relative_to(REPO).as_posix() for p in results.glob("*/figures.json"))
    assert sorted(folder for folder, _ in blocks) == with_figures


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_into_the_benchmarks_page_find_their_section():
    """README.md's and docs/'s links to docs/benchmarks.md#section (and the page's own #section links)
    name headings that exist: the page is rewritten as results change, its readers' links must not die."""
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    anchors = {_anchor(line.lstrip("#")) for line in page.splitlines() if line.startswith("#")}
    links = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        links += [(doc.name, a) for a in re.findall(r"benchmarks\.md#([\w-]+)", text)]
        if doc.name == "benchmarks.md":
            links += [(doc.name, a) for a in re.findall(r"\]\(#([\w-]+)\)", text)]
    assert links, "no links into docs/benchmarks.md found"
    assert [(name, a) for name, a in links if a not in anchors] == []


def test_the_results_page_holds_current_figures_on_at_most_400_lines():
    """docs/benchmarks.md is the current figures per hardware kind; how each came about stays in git and in
    docs/results/*.json. A page that grows past 400 lines is growing a history again."""
    lines = len((REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 400, f"docs/benchmarks.md has {lines} lines"
