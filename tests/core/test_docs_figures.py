"""No figure without its record: a measured time, rate, date, ratio or magnitude in a user doc cites a record.

Oracle: a doc's unit of prose (a paragraph, a list item with its continuation lines, a table row, a
heading; the changelog fragments are docs too) that states a measured figure (a number with a unit
of time or throughput: s, ms, µs, us, min, minutes, hours, tokens/s, GB/s, TB/s, TFLOP/s; a date
20XX-XX-XX; a ratio such as ``1.07×`` or ``2.6x`` -- not a shape ``1 x 2``; an error magnitude in
scientific notation such as ``2.5e-6``; a count of effective bits) names the record it came from
(``rec:<id>``, checked against the ledger by tests/core/test_ledger.py) in the same unit. A unit
whose figure is not a measurement (a time limit, a CLI default, a definition) is listed in
``NOT_MEASUREMENTS`` with its reason; every entry there must still match, so the list cannot go
stale. Ratios, magnitudes and bits are looked for outside code (fenced blocks and `inline spans`:
constants such as an ``eps`` of ``1e-6`` are written there) and not after ``eps``. Comments and
docstrings of the package follow the time, throughput and date rule, a comment block or a string
literal as the unit.
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
MAGNITUDE = re.compile(rf"{_NUMBER}\s?[×x](?!\s?\d)(?![\w×])"  # a ratio, not a shape such as 1 x 2
                       r"|(?<![\w.])(?<!eps )\d(?:\.\d+)?e-\d+\b"  # an error magnitude, not an eps
                       rf"|{_NUMBER}\s(?:effective )?bits\b")
CODE = re.compile(r"^\s*```.*?^\s*```[^\n]*$|`[^`\n]*`", re.S | re.M)

# (file, text the unit contains) -> why that unit's figure is not a measurement.
NOT_MEASUREMENTS: dict[tuple[str, str], str] = {
    ("docs/fuzzing.md", "`nox -s fuzz -- [BUDGET_S]"): "the CLI's default budget",
    ("docs/fuzzing.md", "`shrink_budget_s`, default 20 s"): "the CLI's default shrink budget",
    ("docs/fuzzing.md", "Every job stops drawing at `DEADLINE_S` = 480 s"):
        "the recipe's deadline constant and the call limit it fits",
    ("README.md", "when worse than the declared mode by more than 2×"): "the ⚠ threshold, a definition",
    ("docs/architecture.md", "top 24 bits of the first word"): "how many random bits a stochastic rounding draws",
    ("docs/benchmarks.md", "rotated through 4x the L2"): "the timing method's working-set size",
    ("docs/benchmarks.md", "max(5, 3 x the worst change"): "the gate's threshold rule",
    ("docs/benchmarks.md", "declared precision by more than 2x"): "the ⚠ threshold and the drift budget, definitions",
    ("docs/drift_report_schema.md", "2.4e-4 at s32a32, 0.5 at the bf16-activation modes"):
        "the gross bound's formula evaluated per mode",
    ("docs/validation.md", "within 2 × the source row's own state error"): "the materialize check's rule",
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


def _blank_code(text: str) -> str:
    """``text`` with fenced blocks and inline code spans blanked, its lines kept."""
    return CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def unrecorded_figures(text: str, allowed: tuple[str, ...] = (), magnitudes: bool = False) -> list[tuple[int, str]]:
    """(line, figure) of each measured figure in ``text`` whose unit cites no record and is not
    ``allowed`` (a unit containing one of those strings is skipped); with ``magnitudes`` also the
    ratios, magnitudes and bits outside code."""
    found = [(start, m.group()) for start, unit in _units(text)
             if not CITATION.search(unit) and not any(a in unit for a in allowed)
             for m in FIGURE.finditer(unit)]
    if magnitudes:
        units = dict(_units(text))
        found += [(start, m.group()) for start, unit in _units(_blank_code(text))
                  if not CITATION.search(units.get(start, unit))
                  and not any(a in units.get(start, unit) for a in allowed)
                  for m in MAGNITUDE.finditer(unit)]
    return sorted(found)


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


def test_scanner_finds_planted_ratios_magnitudes_and_bits():
    doc = ("The kernel fails at 1.07× the bound.\n\nIts state error is 2.5e-6, 12.9 effective bits.\n\n"
           "| grid | 1 x 2 | ok |\n\nAn `eps` of `1e-6`, and eps 1e-5.\n\n```\nq = u / sqrt(s + 1e-6)\n```\n\n"
           "Cited: 850x, rec:94c653ee303adf2e.\n")
    assert unrecorded_figures(doc, magnitudes=True) == [(1, "1.07×"), (3, "12.9 effective bits"), (3, "2.5e-6")]
    assert unrecorded_figures(doc) == []


@pytest.mark.parametrize("text", ["s32a16 at 10^6 tokens", "2,000 scenarios of 12 steps", "4 u of fp32",
                                  "`--tokens 1000000`", "sm90s and fp16s", "T' = 4, k = 4"])
def test_scanner_leaves_inputs_and_spec_parameters_alone(text):
    assert unrecorded_figures(text) == []


@pytest.mark.parametrize("path", DOCS)
def test_user_docs_cite_a_record_for_every_measured_figure(path):
    found = unrecorded_figures((ROOT / path).read_text(), _allowed(path), magnitudes=True)
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
