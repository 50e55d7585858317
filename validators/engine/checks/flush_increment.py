"""Check ``flush-increment``: the error one flush adds, against an fp64 fold of the kernel's own storage.

Oracle: the family's literal math (``FamilyMath.window``) run in fp64 on the kernel's own
previous checkpoint and its own stored records (the snapshot before the verify: checkpoint,
ring rows of logical positions 0..write_pos-1, cursors) and the window's inputs: the state the
flush must store, exactly, given what the kernel stored before.  Record rounding the mode allows
is therefore excluded; what is left is the fold's arithmetic and one rounding to the state
format.  The new checkpoint's max abs difference from it, relative to the fold's row maximum,
in units of the declared state format's u, must stay below::

    MAX_STORE_U + FACTOR x u_c / u_s x (K_SUM n + K_EXP L) x max(1, M / scale)

(one rounding of the state format, plus the fold's fp32 arithmetic of ``checks/fp64_bound.py``:
n records folded, decay exponent L, M the bound on the sizes of the fold's contributions, which
exceeds the fold's row maximum ``scale`` where they cancel).  ``u_c`` is the arithmetic's u, the
readout dot left out (a ``-tf32`` mode does not loosen it), except where the flush also folds window
position 0 of a family whose records read the state through the dot (GDN, KDA standard decode: that
record is computed in the window, S k at the dot's precision): there the limit adds
``FACTOR x K_DOT x u_dot / u_s x |S_v|_2 / scale``, the dot's rounding of that one record.  Measured reason
for M (nightly run 5, kda tiny K=2 V=1, s32a32, prefill initial state, seed 602029; its reproducer is
golden/regressions/kda-literal-replay-flush-increment-s32a32-seed602029.json): the literal
model's own flush added 15.6 u against 13 u relative to the result's maximum (the delta rule's
update cancelling the state along k).  Measured on tiny (literal replay models, both
families, s32a32 / s32a16 / s16a16 / sfp16a16 / sfp8a16 / si8a16 / s16a16-sr, five input
distributions, speculative and standard, 30 steps) at most 0.22 of the threshold (0.44 before
FACTOR); the Triton kernels under the interpreter (triton-replay, both families, s32a32 /
s32a16 / s16a16, mild and large-delta, 10 steps) at most 0.38 (GDN s32a16 large-delta: its
decay weights come from cumulative sums); a checkpoint rounded to bf16 at fp32 reaches 10^3
times it.  A snapshot whose record buffers do not
match the family's record layout is not judged (a note says so).
"""

from __future__ import annotations

import torch

from replayssm.conventions import conv_kwargs
from replayssm.interface import PAD_SLOT
from replayssm.precision import REFERENCE
from replayssm.rounding import dequantize_state
from replayssm.validators.engine.checks.fp64_bound import FACTOR, K_EXP, K_SUM
from replayssm.validators.engine.checks.registry import REPLAY, register_check

# One rounding to the state format is <= 1 u of the element (<= 2 u with stochastic rounding);
# 4 u leaves room for a row whose maximum moved by a flush.
MAX_STORE_U = 4.0
# A product of two operands each rounded to the dot's format: 2 u_dot relative.
K_DOT = 2.0


def _history(snap, slot: int, n: int, ring: int) -> dict[str, torch.Tensor]:
    origin = int(snap.origin[slot])
    idx = torch.tensor([(origin + p) % ring for p in range(n)], dtype=torch.long, device=snap.checkpoint.device)
    return {k: v[slot].index_select(0, idx).to(torch.float64) for k, v in snap.records.items()}


def fold_of_own_storage(ctx, r: int, with_before: bool = False):
    """fp64: the state row ``r``'s flush must store, from the kernel's own storage before the verify
    (``with_before``: and the state before the window, ``(want, before)``)."""
    run = ctx.run
    snap = ctx.snapshots.get("before-verify")
    math = ctx.resolved.family.literal_replay.math
    layout = math.record_layout(ctx.resolved.geometry)
    if snap is None or set(snap.records) != set(layout):
        return None
    s = run.ids_list[r]
    scale = None if snap.checkpoint_scale is None else snap.checkpoint_scale[s]
    s0 = dequantize_state(snap.checkpoint[s], scale, torch.float64)
    ring = next(iter(snap.records.values())).shape[1]
    hist = _history(snap, s, int(snap.write_pos[s]), ring)
    dev = s0.device  # where the snapshot lives (the kernel's device or the CPU)
    win = {k: v[r].to(dev, torch.float64) for k, v in ctx.inputs.items()}
    params = {k: v.to(dev) for k, v in run.ref_params.items()}
    res = math.window(s0, hist, win, params, REFERENCE, dict(run.sc.kernel_options), **conv_kwargs(run.conv))
    # what the declared bookkeeping policy's flush folds: the committed prefix, or it and window position 0
    want = res.state_after_first if run.dec.flush_folds_first else res.state_before
    return (want, res.state_before) if with_before else want


@register_check("flush-increment", hooks="at-flush", schedule="invariants", kinds=REPLAY,
                needs=("before-verify", "checkpoint"),
                catches="a flush that adds more error than one rounding of the declared state format to the fold "
                        "of the kernel's own previous checkpoint and records (a fold or store at lower precision)",
                mutant="mutant-flush-bf16-arithmetic", witness={"family": "gdn", "steps": 10})
def flush_increment(ctx) -> None:
    run = ctx.run
    mode = ctx.resolved.mode
    # The fold's arithmetic is fp32 whatever the readout dot; but a flush that also folds window
    # position 0 of a family whose records read the state through the dot builds that record with
    # S k at the dot's precision: beta e^g |delta(S k)_v| <= K_DOT u_dot |S_v|_2 (|k| = 1), per element.
    u_s, u_c = mode.state_unit_roundoff, mode.arith_unit_roundoff
    u_dot = (mode.dot_unit_roundoff if run.dec.flush_folds_first
             and "state-read-records" in ctx.resolved.family.capabilities else 0.0)
    terms = None if ctx.fp64 is None else ctx.fp64.get("fold_terms")
    fold_abs = None if ctx.fp64 is None else ctx.fp64.get("fold_abs")
    for r in ctx.flush_rows:
        if run.ids_list[r] == PAD_SLOT:
            continue
        own = fold_of_own_storage(ctx, r, with_before=True)
        if own is None:
            note = "flush-increment: the kernel's record buffers do not match the family's layout; not judged"
            if note not in run.notes:
                run.notes.append(note)
            return
        want, before = own
        got = ctx.checkpoint[r].to(want.device)
        scale = float(want.abs().max())
        if not torch.isfinite(got).all() or scale == 0.0:
            continue
        in_u = float((got - want).abs().max()) / (u_s * scale)
        extra = float(terms[r]) if terms is not None else K_SUM * int(run.wp[r]) + K_EXP
        limit = MAX_STORE_U + FACTOR * u_c / u_s * extra
        if u_dot:
            limit += FACTOR * K_DOT * u_dot / u_s * float(before.norm(dim=-1).max()) / scale
        if fold_abs is not None:  # contributions that cancel: the arithmetic's bound on their sizes
            limit = max(limit, MAX_STORE_U + FACTOR * float(fold_abs[r]) / (u_s * scale))
        ctx.record["flush_increment_ratio"] = max(ctx.record.get("flush_increment_ratio", 0.0), in_u / limit)
        if in_u > limit:
            ctx.fail("flush-increment",
                     f"checkpoint declared {mode.state}: this flush adds {in_u:.3g} u of {mode.state} to the fp64 fold "
                     f"of the kernel's own previous checkpoint and records (one rounding allows {limit:.3g} u): "
                     f"the fold or the store runs below {mode.state} precision",
                     row=r, slot=run.ids_list[r], value=in_u, bound=limit)


__all__ = ["K_DOT", "MAX_STORE_U", "flush_increment", "fold_of_own_storage"]
