"""Our Triton kernels driven the way serving engines drive them: the packed layout
(``query_start_loc``, a different window length per row) and standard steps on speculative slots
(drafting switched off and on), on CPU through the interpreter.

Oracle: ``run_scenario`` (fp64 reference on the accepted stream, the literal model at the same mode
for the tolerance rule, the window-tail / padding-output / unwritten-output checks on the poisoned
output buffer, cursor and committed-storage invariants under the spec's rule).  The kernels run these
layouts through ``replayssm/ops/serving_layouts.py`` around their padded launches; a kernel that
reads or writes the packed buffer one token off is caught, and bad offsets are refused before
anything changes.
Geometry ``micro``: 2 heads of the smallest tiles the kernels take, speculative T' = 3, B = 4 (ring
8; flushes from write_pos 2 on), 3 rows (row 1 padding), explicit plans of 3-4 steps.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, settings
from serving_plans import MICRO, MIXED, PACKED

from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.registry import get
from replayssm.scenarios.inputs import make_inputs, make_params
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.strategies import serving_options
from replayssm.validators.engine.runner import run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")

KERNELS = [("mamba2", "triton-replay"), ("mamba2", "triton-replay-state"), ("mamba2", "triton-baseline"),
           ("gdn", "triton-replay"), ("gdn", "triton-baseline"), ("kda", "triton-replay"), ("kda", "triton-baseline")]
# the mixed runs take the single-kernel path where the interpreter's default is the two-launch one
SINGLE = {("mamba2", "triton-replay"): {"prepass": False}, ("gdn", "triton-replay"): {"prepass": False}}


def _sc(family, params, **kw) -> Scenario:
    return Scenario.tiny(family, geometry=MICRO[family], mode="s32a16", window=3, buffer=4, schedule="explicit",
                         schedule_params=params, **kw)


def _ids(prefix):
    return [f"{prefix}-s32a16-T3-B4-micro-{fam}-{name.removeprefix('triton-')}" for fam, name in KERNELS]


def _passes(res):
    assert res.exception is None, res.exception
    assert res.passed, [str(f) for f in res.failures[:5]]


@pytest.mark.parametrize("family,name", KERNELS, ids=_ids("packed"))
def test_triton_kernels_pass_a_packed_ragged_plan(family, name):
    res = run_scenario(_sc(family, PACKED), get(name, family), repeat_check=False)
    _passes(res)
    assert res.coverage["packed verifies"] == 3 and res.coverage["flush verifies"] > 0
    assert res.tokens_verified == 2 + 3 + 1 + 3 + 3 + 1  # each row's own window, not T' per row


@pytest.mark.parametrize("family,name", KERNELS, ids=_ids("mixed"))
def test_triton_kernels_pass_standard_steps_on_speculative_slots(family, name):
    sc = _sc(family, MIXED, kernel_options=SINGLE.get((family, name), {}))
    res = run_scenario(sc, get(name, family), repeat_check=False)
    _passes(res)
    assert res.coverage["standard steps on speculative slots"] == 2 and res.coverage["flush verifies"] > 0


class _ReadsOneLate(get("triton-replay", "mamba2")):
    """Reads row r's packed tokens from query_start_loc[r] + 1 (offsets shifted by one)."""

    name = "reads-packed-one-late"

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        if query_start_loc is not None:
            inputs = {k: torch.roll(v, -1, 0).contiguous() for k, v in inputs.items()}
        return super().verify(slot_ids, inputs, out, window_lens, query_start_loc)


class _WritesOneLate(get("triton-replay", "mamba2")):
    """Writes row r's outputs from query_start_loc[r] + 1 (offsets shifted by one)."""

    name = "writes-packed-one-late"

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        if query_start_loc is None:
            return super().verify(slot_ids, inputs, out, window_lens)
        got = super().verify(slot_ids, inputs, None, window_lens, query_start_loc)
        n = int(query_start_loc[-1])
        out[1:n + 1] = got[:n]
        return out


@pytest.mark.parametrize("cls,checks", [(_ReadsOneLate, {"output", "state"}),
                                        (_WritesOneLate, {"unwritten-output", "padding-output", "window-tail"})],
                         ids=["packed-reads-one-late-s32a16-T3-B4-micro-mamba2",
                              "packed-writes-one-late-s32a16-T3-B4-micro-mamba2"])
def test_a_packing_off_by_one_token_is_caught(cls, checks):
    res = run_scenario(_sc("mamba2", PACKED), cls, repeat_check=False, stop_on_failure=True)
    assert not res.passed and res.first_failure.step == 0
    assert res.first_failure.check in checks, res.first_failure


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("qsl,match", [
    ([0, 2, 2, 7], r"query_start_loc\[3\]: row 2's window length .* = 5, expected 1 <= T'_r <= T'max = 3"),
    ([0, 2, 3, 5], r"query_start_loc\[2\]: row 1 is a padding row"),
    ([1, 3, 3, 5], r"query_start_loc\[0\]: expected 0"),
    ([0, 3, 3, 6], r"query_start_loc\[3\]: the offsets hold 6 tokens, the packed inputs 5"),
], ids=["window-too-long", "padding-row-tokens", "first-not-zero", "past-the-buffer"])
def test_bad_offsets_are_refused_before_anything_changes(family, qsl, match):
    sc = _sc(family, PACKED)
    k = get("triton-replay", family)(KernelConfig(sc.geometry_obj, make_params(sc), sc.precision, sc.decode_config,
                                                  sc.num_slots))
    ids = torch.tensor(sc.slot_ids)
    k.reset(ids)
    before = k.snapshot()
    inputs = {n: v.flatten(0, 1)[:5].contiguous() for n, v in make_inputs(sc, 0).items()}
    with pytest.raises(ValueError, match=match):
        k.verify(ids, inputs, query_start_loc=torch.tensor(qsl))
    after = k.snapshot()
    assert torch.equal(before.checkpoint, after.checkpoint) and torch.equal(before.write_pos, after.write_pos)
    assert all(torch.equal(before.records[n], after.records[n]) for n in before.records)
    assert not any(k.pending if isinstance(k.pending, list) else k.pending.tolist())


def test_a_commit_past_the_rows_window_is_refused():
    sc = _sc("gdn", PACKED)
    k = get("triton-replay", "gdn")(KernelConfig(sc.geometry_obj, make_params(sc), sc.precision, sc.decode_config,
                                                 sc.num_slots))
    ids = torch.tensor(sc.slot_ids)
    k.reset(ids)
    inputs = {n: v.flatten(0, 1)[:9].contiguous() for n, v in make_inputs(sc, 0).items()}
    k.verify(ids, inputs, query_start_loc=torch.tensor([0, 2, 2, 3]))
    with pytest.raises(ValueError, match=r"accepted\[2\]: expected 1 <= k <= T'_r = 1 \(the row's window length\)"):
        k.commit(ids, torch.tensor([2, 0, 2]))
    k.commit(ids, torch.tensor([2, 0, 1]))
    assert k.write_pos[list(sc.slot_ids)].tolist() == [2, 0, 1]


@pytest.mark.parametrize("family,name,options", [("mamba2", "triton-replay", {}),
                                                 ("gdn", "triton-replay", {"prepass": False})],
                         ids=["ragged-s32a16-T3-B4-micro-mamba2-replay", "ragged-s32a16-T3-B4-micro-gdn-replay-fused"])
def test_a_ragged_verify_is_bit_identical_to_a_padded_one_whatever_the_tail(family, name, options):
    """Row r's first T'_r outputs do not depend on the window tokens past them (the wrapper's zeros
    or the caller's drafts): the wrapper is the padded kernel, not an approximation of it (Mamba-2's
    two-launch path; GDN's single kernel with its in-window WY/UT solve)."""
    sc = _sc(family, PACKED)
    outs = []
    for lens in (torch.tensor([1, 1, 2]), None):
        k = get(name, family)(KernelConfig(sc.geometry_obj, make_params(sc), sc.precision, sc.decode_config,
                                           sc.num_slots, options=options))
        ids = torch.tensor(sc.slot_ids)
        k.reset(ids)
        outs.append(k.verify(ids, make_inputs(sc, 0), window_lens=lens))
    assert torch.equal(outs[0][0, :1], outs[1][0, :1]) and torch.equal(outs[0][2, :2], outs[1][2, :2])
    assert outs[0][0, 1:].isnan().all() and outs[0][2, 2:].isnan().all() and outs[0][1].isnan().all()


def test_a_host_cursor_table_is_refused_naming_the_kernels_policy():
    sc = _sc("mamba2", PACKED)
    k = get("triton-baseline", "mamba2")(KernelConfig(sc.geometry_obj, make_params(sc), sc.precision,
                                                      sc.decode_config, sc.num_slots))
    ids = torch.tensor(sc.slot_ids)
    k.reset(ids)
    with pytest.raises(ValueError, match=r"cursors: kernel 'triton-baseline' keeps its own cursors \(bookkeeping"):
        k.verify(ids, make_inputs(sc, 0), cursors=torch.zeros((sc.num_slots, 2), dtype=torch.int64))
    assert not any(k.pending)


@pytest.mark.parametrize("option", ["window_lens", "layout", "standard_steps"])
def test_the_fuzzer_draws_the_serving_layouts_for_the_triton_kernels(option):
    plan = {"accepted": [[2, 0, 1], [1, 0, 2]]}
    strat = serving_options(get("triton-replay", "gdn"), DecodeConfig("speculative", 2, 4), (3, -1, 1), plan)
    find(strat, lambda p: bool(p.get(option)) and p.get(option) != "padded", settings=settings(max_examples=200,
                                                                                                 database=None))
