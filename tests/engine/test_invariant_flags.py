"""The snapshot checks' device flags raise exactly when the check they gate would report.

Oracle: the per-field, per-slot comparisons of ``validators/engine/invariants.py`` (``bits_equal``,
``changed_fields``, ``checkpoint_changed``, ``changed_ring_rows``) and the checks' ``run``
functions that use them.  A flag that stays down where ``run`` would report hides a failure (the
engine calls ``run`` only when the flag is up); a flag that goes up where ``run`` reports nothing
costs time only.  Here every single-element change of a real kernel's snapshot (each field, slot,
ring row) must raise the flag of each check that then reports it, and an untouched snapshot must
raise none.  Also: the batched fp64 committed-state fold equals the per-row fold to 1e-12.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from replayssm.interface import KernelSnapshot
from replayssm.ops.committed import committed_rows_fp64
from replayssm.ops.mamba2.literal import Mamba2Math
from replayssm.scenarios import Scenario
from replayssm.validators import Lockstep
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks import CHECKS

pytestmark = pytest.mark.usefixtures("one_thread")

_NAN_A = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
_NAN_B = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
PAIRS = {
    "equal": (torch.arange(6.0), torch.arange(6.0)),
    "one-ulp": (torch.ones(4), torch.nextafter(torch.ones(4), torch.full((4,), 2.0))),
    "nan-payloads": (_NAN_A, _NAN_B),
    "signed-zero": (torch.zeros(3), -torch.zeros(3)),
    "shape": (torch.zeros(3), torch.zeros(4)),
    "dtype": (torch.zeros(3), torch.zeros(3, dtype=torch.float64)),
    "none-vs-tensor": (None, torch.zeros(1)),
    "none-vs-none": (None, None),
    "int": (torch.tensor([1, 2]), torch.tensor([1, 3])),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_any_differ_agrees_with_bits_equal(name):
    a, b = PAIRS[name]
    want = not inv.bits_equal(a, b)
    assert bool(inv.any_differ([(a, b)], torch.device("cpu"))) == want
    # one differing pair among equal ones still raises it; equal pairs alone do not
    eq = PAIRS["equal"]
    assert bool(inv.any_differ([eq, (a, b), eq], "cpu")) == want
    assert not bool(inv.any_differ([eq, eq], "cpu"))


def _lockstep(decode: str, steps: int = 3) -> Lockstep:
    ls = Lockstep(Scenario.tiny("mamba2", decode, steps=8, schedule="random"), "literal-replay")
    for _ in range(steps):
        ls.step()
    return ls


def _ctx(ls: Lockstep, before: KernelSnapshot, after: KernelSnapshot, hook: str, flush_rows=()):
    failures = []
    ctx = types.SimpleNamespace(run=ls, hook=hook, flush_rows=list(flush_rows), fold_rows=None,
                                snapshots={"before-verify": before, "after-verify": after, hook: after},
                                fail=lambda check, msg, **where: failures.append(check), plan=None)
    return ctx, failures


def _fields(snap: KernelSnapshot):
    """(label, tensor) of every storage tensor of a snapshot whose first dimension is the slot."""
    yield "checkpoint", snap.checkpoint
    if snap.checkpoint_scale is not None:
        yield "checkpoint_scale", snap.checkpoint_scale
    for k, v in snap.records.items():
        yield f"records.{k}", v


def _perturbed(snap: KernelSnapshot, label: str, index: tuple[int, ...]) -> KernelSnapshot:
    """A copy of ``snap`` with one element of one field changed in its lowest bit."""
    new = dataclasses.replace(snap, checkpoint=snap.checkpoint.clone(), records={k: v.clone() for k, v in
                                                                                 snap.records.items()},
                              checkpoint_scale=None if snap.checkpoint_scale is None else snap.checkpoint_scale.clone())
    t = dict(_fields(new))[label]
    bits = inv.int_view(t).view(-1)
    flat = torch.tensor(index).mul(torch.tensor(t.stride())).sum().item()
    bits[flat] ^= 1
    return new


@pytest.mark.parametrize("decode", ["speculative", "standard"])
@pytest.mark.parametrize("check", ["unused-slot", "checkpoint-unchanged", "committed-ring-rows"])
def test_flag_raised_whenever_the_check_reports(decode, check):
    ls = _lockstep(decode)
    unit = CHECKS[check]
    hook = "after-verify"
    snap = ls.snapshot()
    gen = torch.Generator().manual_seed(7)
    ctx, failures = _ctx(ls, snap, snap, hook)
    assert not bool(unit.flag(ctx)), "an untouched snapshot raised the flag"
    unit.run(ctx)
    assert not failures
    reported = 0
    for label, t in _fields(snap):
        for slot in range(t.shape[0]):
            rows = range(t.shape[1]) if label.startswith("records.") else [None]
            for row in rows:
                lead = (slot,) if row is None else (slot, row)
                rest = tuple(int(torch.randint(0, d, (1,), generator=gen)) for d in t.shape[len(lead):])
                after = _perturbed(snap, label, lead + rest)
                ctx, failures = _ctx(ls, snap, after, hook)
                flag = bool(unit.flag(ctx))
                unit.run(ctx)
                assert flag or not failures, f"{check}: {label}{lead + rest} reported {failures} under a low flag"
                reported += bool(failures)
    assert reported, f"{check}: no single-element change was reported (the test checks nothing)"


def test_committed_fold_of_rows_equals_the_per_row_fold():
    gen = torch.Generator().manual_seed(3)
    S, ring, H, P, N, G = 5, 8, 4, 3, 6, 2
    records = {"dt": torch.rand(S, ring, H, generator=gen, dtype=torch.float64) * 0.3,
               "x": torch.randn(S, ring, H, P, generator=gen, dtype=torch.float64),
               "B": torch.randn(S, ring, G, N, generator=gen, dtype=torch.float64)}
    ckpt = torch.randn(S, H, P, N, generator=gen, dtype=torch.float64)
    params = {"A": -torch.rand(H, generator=gen, dtype=torch.float64)}
    ids, wp, origin = [3, -1, 1, 0, 4], [2, 0, 5, 0, 5], [1, 0, 6, 0, 2]
    got = committed_rows_fp64(ids, wp, origin, ring, records, lambda s: ckpt.index_select(0, s),
                              lambda s0, h: Mamba2Math().fold_rows(s0, h, params, None), (H, P, N), "cpu")
    for r, s in enumerate(ids):
        if s < 0:
            assert torch.isnan(got[r]).all()
            continue
        idx = torch.tensor([(origin[s] + p) % ring for p in range(wp[s])], dtype=torch.long)
        want = Mamba2Math().fold(ckpt[s], {k: v[s].index_select(0, idx) for k, v in records.items()}, params, None)
        torch.testing.assert_close(got[r], want, rtol=1e-12, atol=1e-12)
