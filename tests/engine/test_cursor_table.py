"""The cursor tables of drift's fast path against the bookkeeping policies they tabulate.

Oracle: ``DecodeConfig.is_flush`` / ``commit_cursor``, row by row.  Expected difference: none, on
random walks of 64 rows through every policy, both decodes and several (T', B) -- and a cursor
outside the policy's domain is refused with the argument named.
"""

from __future__ import annotations

import numpy as np
import pytest

from replayssm.interface import POLICIES, DecodeConfig
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.cursor_table import CursorTable
from replayssm.validators.engine.runner import Lockstep

DECODES = [("standard", 1, 16), ("standard", 1, 5), ("speculative", 4, 16), ("speculative", 2, 2),
           ("speculative", 3, 7)]
CASES = [(p, *d) for p in sorted(POLICIES) for d in DECODES]


@pytest.mark.parametrize("tabulated", [True, False], ids=["tables", "untabulated"])
@pytest.mark.parametrize("policy,decode,T,B", CASES, ids=[f"{p}-{d}-T{t}-B{b}" for p, d, t, b in CASES])
def test_tables_walk_as_the_policy_does(policy, decode, T, B, tabulated, monkeypatch):
    """Both forms: the tables, and the policy asked row by row (a decode too large to tabulate)."""
    try:
        dec = DecodeConfig(decode, T, B, policy)
    except ValueError:
        pytest.skip("not a valid decode for this policy")
    if not tabulated:
        monkeypatch.setattr("replayssm.validators.engine.cursor_table.MAX_ENTRIES", 0)
    tab = CursorTable(dec)
    assert tab.tabulated == tabulated
    rng = np.random.default_rng(7)
    R = 64
    wp, org = np.zeros(R, dtype=np.int64), np.zeros(R, dtype=np.int64)
    for _ in range(200):
        k = rng.integers(1, T + 1, size=R)
        fl = tab.is_flush(wp)
        assert fl.tolist() == [dec.is_flush(int(w)) for w in wp]
        nwp, norg = tab.commit(wp, org, fl, k)
        want = [dec.commit_cursor(int(w), int(o), bool(f), int(kk)) for w, o, f, kk in zip(wp, org, fl, k)]
        assert list(zip(nwp.tolist(), norg.tolist())) == want
        rows = rng.random(R) < 0.8  # step: the masked rows move, the others keep their cursors
        sfl, swp, sorg = tab.step(wp, org, k, rows)
        assert sfl.tolist() == (fl & rows).tolist()
        assert swp.tolist() == np.where(rows, nwp, wp).tolist() and sorg.tolist() == np.where(rows, norg, org).tolist()
        wp, org = nwp, norg


def test_out_of_domain_cursors_are_refused():
    tab = CursorTable(DecodeConfig("speculative", 4, 16))
    with pytest.raises(ValueError, match="write_pos"):
        tab.is_flush(np.array([0, 17]))
    with pytest.raises(ValueError, match="origin"):
        tab.commit(np.array([0]), np.array([32]), np.array([False]), np.array([1]))
    with pytest.raises(ValueError, match="accepted"):
        tab.commit(np.array([0]), np.array([0]), np.array([False]), np.array([5]))


@pytest.mark.parametrize("schedule", ["zero-accept", "slot-reuse"])
def test_cursors_before_walks_as_the_step_moves_them(schedule):
    """``Lockstep.cursors_before`` (failure messages) gives every step's cursors as the step found them,
    a staged fold's commit(0) included (it moves no cursor), from the same rule through the tables."""
    sc = Scenario.tiny("mamba2", "speculative", schedule=schedule, steps=16)
    ls = Lockstep(sc, "literal-replay-staged")
    ls.start()
    seen = []
    for p in ls.plans:
        ls.reset_rows(p)
        seen.append([(ls.wp[r], ls.origin[r]) for r in ls.active])
        ls.reset_rows = lambda p: None  # (the step's own call: done above)
        ls.step()
        del ls.reset_rows
    assert [[ls.cursors_before(p.step)[r] for r in ls.active] for p in ls.plans] == seen
    wp, org = CursorTable(ls.dec, staged=True).commit(np.array([5]), np.array([3]), np.array([True]), np.array([0]))
    assert (wp.tolist(), org.tolist()) == ([5], [3])
