"""The check registry: every check is a documented unit with a witness mutant it catches first.

Oracle: each registered check names a gallery mutant whose one bug that check exists to catch;
on the check's witness scenario (``Scenario.tiny`` plus the registration's overrides) that
mutant must fail with this check as its first failure.  docs/validation.md must list exactly
the registered checks with their hooks, and the Lockstep must take a snapshot only where a
check due at that step needs one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from replayssm.scenarios import Scenario
from replayssm.validators import Lockstep, run_scenario
from replayssm.validators.engine.checks import CHECKS, HOOKS, SCHEDULES
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.result import CHECKS as REPORT_CHECKS

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
# The failure names results, docs, tests and the fuzz corpus use: they must not change.
NAMES = {"exception", "out-param", "unwritten-output", "non-finite", "padding-output", "unused-slot",
         "stored-precision", "flush-increment",
         "checkpoint-unchanged", "committed-ring-rows", "cursor", "output", "flush-checkpoint", "state", "repeat",
         "window-tail", "zero-accept", "inputs-unchanged", "accepted-range", "view-gaps", "staged-fold", "materialize"}

pytestmark = pytest.mark.usefixtures("one_thread")


def witness_scenario(check) -> tuple[str, Scenario]:
    spec = all_mutants()[check.mutant]
    kw = dict(check.witness)
    family = kw.pop("family", next(iter(spec.classes)))
    decode = kw.pop("decode", spec.decodes[0])
    kw.setdefault("steps", 6)
    return family, Scenario.tiny(family, decode, **kw)


def test_the_registry_keeps_the_failure_names():
    assert set(CHECKS) == NAMES
    assert list(REPORT_CHECKS) == list(CHECKS)
    for c in CHECKS.values():
        assert c.hooks and set(c.hooks) <= set(HOOKS) and c.schedule in SCHEDULES
        assert c.catches and c.mutant in all_mutants(), c.name


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_check_catches_its_witness_mutant_first(name):
    check = CHECKS[name]
    family, sc = witness_scenario(check)
    res = run_scenario(sc, check.mutant)
    assert not res.passed
    assert name in res.failure_counts, res.to_markdown()
    assert res.first_failure.check == name, res.to_markdown()


def _doc_table() -> dict[str, tuple[tuple[str, ...], str]]:
    text = DOC.read_text()
    section = text.split("## Checks", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z-]+)` \| ([^|]+) \|.*\| `(mutant-[a-z0-9-]+)` \|$", line)
        if m:
            rows[m.group(1)] = (tuple(h.strip(" `") for h in m.group(2).split(",")), m.group(3))
    return rows


def test_validation_doc_lists_exactly_the_registered_checks_with_their_hooks_and_mutants():
    doc = _doc_table()
    assert set(doc) == set(CHECKS), f"in the doc only: {set(doc) - set(CHECKS)}, unlisted: {set(CHECKS) - set(doc)}"
    for name, c in CHECKS.items():
        assert doc[name] == (c.hooks, c.mutant), name


class _CountsSnapshots:
    snapshots = 0

    def snapshot(self):
        type(self).snapshots += 1
        return super().snapshot()


@pytest.mark.parametrize("kernel,every,want", [
    # canaries once, then per checked step (0, 2 and the last, 3): before and after the verify,
    # after the commit; one more after the accepted-range probe of the first step (no step flushes)
    ("literal-replay", 2, 1 + 3 * 3 + 1),
    # a baseline has no check that needs the snapshot before the verify
    ("literal-baseline", 2, 1 + 2 * 3 + 1),
    ("literal-replay", 0, 0),
], ids=["replay-every2", "baseline-every2", "replay-off"])
def test_snapshots_are_taken_only_where_a_due_check_needs_them(kernel, every, want):
    from replayssm.registry import get
    sc = Scenario.tiny("mamba2", schedule="always-1", steps=4)
    cls = type("Counted", (_CountsSnapshots, get(kernel, "mamba2")), {"snapshots": 0})
    ls = Lockstep(sc, cls, invariants_every=every, literal_every=0)
    for _ in range(4):
        ls.step()
    assert cls.snapshots == want


def test_the_checks_run_come_from_the_registry():
    sc = Scenario.tiny("mamba2", schedule="always-1", steps=2)
    replay = run_scenario(sc, "literal-replay", repeat_check=False)
    names = [c.split(" (")[0] for c in replay.checks]
    assert names == [n for n in CHECKS if n != "repeat"]
    base = run_scenario(sc, "literal-baseline")
    names = [c.split(" (")[0] for c in base.checks]
    assert "cursor" not in names and "flush-checkpoint" not in names and "repeat" in names
