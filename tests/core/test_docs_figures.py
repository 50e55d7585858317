"""No figure without its record: a measured time, throughput or date in a user-facing doc cites a record.

Oracle: a doc's unit of prose (a paragraph, a list item with its continuation lines, a table row, a
heading; the changelog fragments are docs too) that states a measured figure (a number with a unit
of time or throughput: s, ms, µs, us, min, minutes, hours, tokens/s, GB/s, TB/s, TFLOP/s; or a date
20XX-XX-XX) names the record it came from (``rec:<id>``, checked against the ledger by
tests/core/test_ledger.py) in the same unit. A unit whose figure is not a measurement (a time limit,
a CLI default) is listed in ``NOT_MEASUREMENTS`` with its reason; every entry there must still
match, so the list cannot go stale. Comments and docstrings of the package follow the same rule, a
comment block or a string literal as the unit.
"""

import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "tools/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "changelog.d").glob("*.md"))]
PACKAGE_DIRS = ("replayssm", "validators", "scenarios", "golden", "tools")

_NUMBER = r"(?<![\w.^])\d[\d,]*(?:\.\d+)?"
_UNIT = (r"(?:µs|us|ms|s|min|minutes?|seconds?|hours?|(?:validated )?tokens/s|scenarios/s|GB/s|TB/s"
         r"|TFLOP/s)(?![\w/])")
FIGURE = re.compile(rf"{_NUMBER}\s?(?:x\s)?{_UNIT}|\b20\d\d-[01]\d-[0-3]\d\b")
CITATION = re.compile(r"rec:[0-9a-f]{16}")

# (file, text the unit contains) -> why that unit's figure is not a measurement.
NOT_MEASUREMENTS: dict[tuple[str, str], str] = {
    ("docs/fuzzing.md", "`nox -s fuzz -- [BUDGET_S]"): "the CLI's default budget",
    ("docs/fuzzing.md", "`shrink_budget_s`, default 20 s"): "the CLI's default shrink budget",
    ("docs/fuzzing.md", "every job stops drawing at `DEADLINE_S` = 480 s"):
        "the recipe's deadline constant and the call limit it fits",
    ("docs/scaleout.md", "heartbeat refreshed every `--claim-ttl`/4 seconds"): "a protocol constant",
    ("tools/validate_speed.py", "Issue 18 item 1's target"): "a target the tool measures against",
}


def _units(text: str):
    """(first line number, text) of each unit of prose: paragraphs, list items, table rows, headings."""
    unit, start = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        new_unit = (not stripped or stripped.startswith(("|", "#")) or re.match(r"([-*+]|\d+\.)\s", stripped)
                    or (unit and unit[-1].lstrip().startswith(("|", "#"))))
        if new_unit and unit:
            yield start, "\n".join(unit)
            unit = []
        if stripped:
            if not unit:
                start = n
            unit.append(line)
    if unit:
        yield start, "\n".join(unit)


def unrecorded_figures(text: str, allowed: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(line, figure) of each measured figure in ``text`` whose unit cites no record and is not
    ``allowed`` (a unit containing one of those strings is skipped)."""
    return [(start, m.group()) for start, unit in _units(text)
            if not CITATION.search(unit) and not any(a in unit for a in allowed)
            for m in FIGURE.finditer(unit)]


def _allowed(path: str) -> tuple[str, ...]:
    return tuple(snippet for (p, snippet) in NOT_MEASUREMENTS if p == path)


def _comment_units(path: Path):
    """(line, text) of each comment block (consecutive comment lines) and string literal of a source."""
    block, start, last = [], 0, -2
    with open(path, "rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type == tokenize.COMMENT:
                if tok.start[0] != last + 1 and block:
                    yield start, "\n".join(block)
                    block = []
                if not block:
                    start = tok.start[0]
                block.append(tok.string.lstrip("#"))
                last = tok.start[0]
            elif tok.type == tokenize.STRING and not tok.string.lstrip("rbuRBU").startswith(("f", "F")):
                yield tok.start[0], tok.string
    if block:
        yield start, "\n".join(block)


def test_scanner_finds_a_planted_unrecorded_figure():
    doc = ("# Speed\n\nThe suite ran 100 tests in 146 s on the CPU.\n\n"
           "| case | µs | record |\n|---|---|---|\n| copy | 2.0 µs | rec:94c653ee303adf2e |\n| replay | 6.2 µs | |\n\n"
           "- measured 2026-12-07, rec:94c653ee303adf2e\n- measured 2026-12-08\n  at 3,659 tokens/s\n")
    assert unrecorded_figures(doc) == [(3, "146 s"), (8, "6.2 µs"), (11, "2026-12-08"), (11, "3,659 tokens/s")]
    assert unrecorded_figures("It held for 12.5 ms, rec:94c653ee303adf2e, and more.") == []
    assert unrecorded_figures("A run of 3 min.\n") == [(1, "3 min")]
    assert unrecorded_figures("A run of 3 min.\n", allowed=("run of",)) == []


@pytest.mark.parametrize("text", ["s32a16 at 10^6 tokens", "2,000 scenarios of 12 steps", "4 u of fp32",
                                  "`--tokens 1000000`", "sm90s and fp16s", "T' = 4, k = 4"])
def test_scanner_leaves_inputs_and_spec_parameters_alone(text):
    assert unrecorded_figures(text) == []


@pytest.mark.parametrize("path", DOCS)
def test_user_docs_cite_a_record_for_every_measured_figure(path):
    found = unrecorded_figures((ROOT / path).read_text(), _allowed(path))
    assert not found, [f"{path}:{line}: {fig}" for line, fig in found]


def test_every_not_measurement_entry_still_matches():
    stale = [key for key in NOT_MEASUREMENTS if key[1] not in (ROOT / key[0]).read_text()]
    assert all(reason for reason in NOT_MEASUREMENTS.values())
    assert not stale, stale


def test_package_comments_cite_a_record_for_every_measured_figure():
    found = [f"{p.relative_to(ROOT)}:{line + offset - 1}: {fig}"
             for d in PACKAGE_DIRS for p in sorted((ROOT / d).rglob("*.py")) if "__pycache__" not in p.parts
             for line, text in _comment_units(p)
             for offset, fig in unrecorded_figures(text, _allowed(str(p.relative_to(ROOT))))]
    assert not found, found
