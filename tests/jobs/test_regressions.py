"""The regression corpus (golden/regressions/*.json) replays on every run.

Oracle: each entry's recorded status (validators/jobs/fuzz/regressions.py): ``fixed`` entries (failures
found by the fuzzer and fixed since) must pass the full validation, ``mutant`` entries must still
fail with the recorded check at the recorded first step.
"""

import pytest

from replayssm.validators.engine.fuzz_artifacts import load_failure
from replayssm.validators.jobs.fuzz.regressions import CORPUS, add, replay

ENTRIES = sorted(CORPUS.glob("*.json"))


pytestmark = pytest.mark.usefixtures("one_thread")


def test_corpus_holds_fixed_failures():
    statuses = [load_failure(p)[1].status for p in ENTRIES]
    assert "fixed" in statuses and set(statuses) <= {"fixed", "mutant"}


@pytest.mark.parametrize("path", ENTRIES, ids=[p.stem for p in ENTRIES])
def test_corpus_entry_still_holds(path):
    ok, msg = replay(path)
    assert ok, f"{path.name}: {msg}"


def test_add_refuses_a_failure_that_still_fails(tmp_path):
    mutant = next(p for p in ENTRIES if load_failure(p)[1].status == "mutant")
    with pytest.raises(ValueError, match="still fails"):
        add(mutant, "not fixed", corpus=tmp_path)
    assert not list(tmp_path.glob("*.json"))
