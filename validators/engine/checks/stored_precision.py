"""Check ``stored-precision``: the precision a kernel really stores, whatever its container's dtype.

Oracle: exact representability.  At a flush, over a sample of the stored values (at least
``SAMPLE`` when the slot rows hold that many, else all; exact zeros and non-finite values left
out) of the new checkpoint and of each record buffer, the share exactly representable in each
floating format coarser than the declared one (fp32 declared: bf16 and fp16; bf16: fp8e4m3;
fp16: bf16 and fp8e4m3).  A value computed in the declared format lands on a coarser grid by
chance only (fp32 on the bf16 grid: 2^-16 of the values); a kernel that rounds to the coarser
format and stores the result in the declared container puts all of them there.  The check fails
when the share is at least ``MAX_SHARE`` over at least ``MIN_VALUES`` values, and (the
checkpoint) only once the row has flushed ``MIN_FLUSHES`` times since its reset (with a zero
initial state and one record, the first folds can be products of few coarse inputs).

Measured (tiny, both families, s32a32 / s32a16 / s16a16 / sfp16a16, the five input
distributions, speculative and standard, 30 steps): for the literal models the largest share
over checkpoints after 2 flushes is 0.02 (bf16-exact of fp32 states) and over record buffers
0.31 (fp8-exact of bf16 inputs with ``near-fp16-limit``); a checkpoint rounded to bf16 in its fp32
container scores 1.00.  Scaled formats (fp8, int8 with a per-row scale) are not judged here: their
codes are the declared format.
"""

from __future__ import annotations

import torch

from replayssm.interface import PAD_SLOT
from replayssm.precision import FORMATS
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import REPLAY, register_check

SAMPLE = 10_000
MIN_VALUES = 256
MAX_SHARE = 0.99
MIN_FLUSHES = 1


def coarser_formats(declared: str) -> list[str]:
    """The floating formats with a larger unit roundoff than ``declared`` (fp8 as a dtype grid)."""
    u = FORMATS[declared].unit_roundoff
    return [f.name for f in FORMATS.values()
            if f.dtype.is_floating_point and f.unit_roundoff > u and f.name != declared]


def sample(values: torch.Tensor) -> torch.Tensor:
    """Evenly spaced nonzero finite values of ``values`` (fp64): ``SAMPLE`` of them, or all."""
    v = values.reshape(-1).to(torch.float64)
    v = v[torch.isfinite(v) & (v != 0)]
    if v.numel() > SAMPLE:
        v = v[evenly_spaced(v.numel(), SAMPLE, v.device)]
    return v


def evenly_spaced(n: int, k: int, device=None) -> torch.Tensor:
    """``k`` evenly spaced indices into ``n`` elements, first and last included, in int64
    arithmetic (a float32 ``linspace`` rounds past ``n - 1`` once ``n`` exceeds 2^24: the
    device-side index assertion of KDA at batch 256 and 512 on an H200)."""
    return torch.arange(k, dtype=torch.int64, device=device) * (n - 1) // max(k - 1, 1)


def exact_shares(values: torch.Tensor, declared: str) -> dict[str, float]:
    """Per coarser format: the share of ``values`` (a sample) exactly representable in it."""
    out = {}
    for name in coarser_formats(declared):
        dt = FORMATS[name].dtype
        back = values.to(dt).to(torch.float64)
        out[name] = float((back == values).to(torch.float64).mean()) if values.numel() else 0.0
    return out


def verdict(what: str, declared: str, values: torch.Tensor) -> str | None:
    """A failure message when ``values`` are (nearly) all on a coarser format's grid."""
    v = sample(values)
    if v.numel() < MIN_VALUES:
        return None
    shares = exact_shares(v, declared)
    bad = [(n, s) for n, s in shares.items() if s >= MAX_SHARE]
    if not bad:
        return None
    # Name the coarsest grid all of them sit on: that is what the kernel stores.
    name, share = max(bad, key=lambda ns: FORMATS[ns[0]].unit_roundoff)
    return (f"{what} declared {declared}: {100 * share:.0f} % of {v.numel()} sampled values {name}-exact "
            f"(a {declared} store puts {100 * 2.0 ** -(_bits(declared) - _bits(name)):.2g} % there by chance): "
            f"the kernel stores {name} precision")


def _bits(fmt: str) -> int:
    """Significand bits (with the implicit one) of a floating format, from its unit roundoff."""
    return round(-torch.log2(torch.tensor(FORMATS[fmt].unit_roundoff)).item())


def declared_record_formats(ctx) -> dict[str, str]:
    """Record name -> the format the mode declares for it (activation, or compute for decay records)."""
    r = ctx.resolved
    mode = r.mode
    layout = r.family.literal_replay.math.record_layout(r.geometry)
    compute = "fp64" if mode.is_reference else "fp32"
    return {name: (mode.act if role == "act" else compute) for name, (_shape, role) in layout.items()}


@register_check("stored-precision", hooks="at-flush", schedule="invariants", kinds=REPLAY,
                needs=("checkpoint", "after-verify"),
                catches="a checkpoint or record buffer whose values all sit on a coarser format's grid than "
                        "declared (e.g. an fp32 checkpoint rounded to bf16 and stored in its fp32 container)",
                mutant="mutant-checkpoint-bf16-precision", witness={"family": "gdn", "steps": 10})
def stored_precision(ctx) -> None:
    run = ctx.run
    mode = ctx.resolved.mode
    rows = [r for r in ctx.flush_rows if run.ids_list[r] != PAD_SLOT]
    if not rows:
        return
    idx = torch.tensor(rows, device=run.device)
    flushes = run.rule.envelope["flushes"].index_select(0, idx)
    ripe = [r for r, f in zip(rows, flushes.tolist()) if f >= MIN_FLUSHES]
    if ripe and not mode.scaled_state:
        vals = ctx.checkpoint.index_select(0, torch.tensor(ripe, device=run.device))
        msg = verdict("checkpoint", mode.state, vals)
        if msg:
            ctx.fail("stored-precision", msg, row=ripe[0], slot=run.ids_list[ripe[0]])
    snap = ctx.snapshots.get("after-verify")
    if snap is None or not snap.records:
        return
    slots = [run.ids_list[r] for r in rows]
    for name, fmt in declared_record_formats(ctx).items():
        buf = snap.records.get(name)
        if buf is None:
            continue
        msg = verdict(f"record buffer {name!r}", fmt, inv.gather(buf, slots))  # where the snapshot lives
        if msg and name in ctx.inputs:
            # A record that is an input kept as it came (Mamba-2 x, B) has the input's grid: the
            # inputs are sampled on a coarse grid at some modes (fp32-exact at s64a64).
            inp = sample(ctx.inputs[name].index_select(0, idx))
            if inp.numel() and max(exact_shares(inp, fmt).values(), default=0.0) >= MAX_SHARE - 0.1:
                msg = None
        if msg:
            ctx.fail("stored-precision", msg, row=rows[0], slot=run.ids_list[rows[0]])


__all__ = ["MAX_SHARE", "MIN_FLUSHES", "MIN_VALUES", "SAMPLE", "coarser_formats", "exact_shares", "stored_precision",
           "verdict"]
