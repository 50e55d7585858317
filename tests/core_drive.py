"""A compact driver for the core tests: one kernel against the fp64 recurrence of spec 2.

The validation engine (``replayssm.validators``) is the suite's comparison path; this driver
exists so the truth itself (the fp64 reference and the literal models) is tested without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replayssm.families import family as family_of
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig
from replayssm.ops.gdn.naive import gdn_sequence
from replayssm.ops.mamba2.naive import mamba2_sequence


def make_params(geometry, gen: torch.Generator) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in geometry.param_shapes().items():
        u = torch.rand(shape, generator=gen)
        if name == "A":
            out[name] = -1.0 - u  # A in [-2, -1]
        elif name == "A_log":
            out[name] = torch.log(0.5 + u)
        else:
            out[name] = (u - 0.5).float()
    return {k: v.float() for k, v in out.items()}


def make_inputs(geometry, rows: int, window: int, dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in geometry.input_shapes().items():
        t = torch.randn((rows, window, *shape), generator=gen, dtype=torch.float64)
        if name == "dt":
            t = t - 2.0
        out[name] = t.to(dtype)
    return out


def reference_sequence(family: str, state, tokens: dict[str, torch.Tensor], params):
    """fp64 outputs for every token of ``tokens`` (each ``[T, ...]``) from ``state``."""
    P = {k: v.double() for k, v in params.items()}
    t = {k: v.double() for k, v in tokens.items()}
    if family == "mamba2":
        return mamba2_sequence(state, t["x"], t["dt"], t["B"], t["C"], P["A"], P["dt_bias"], P["D"], t.get("z"))
    if family == "gdn":
        return gdn_sequence(state, t["q"], t["k"], t["v"], t["a"], t["b"], P["A_log"], P["dt_bias"])
    # Any other family: its registered reference step (its naive.py), token by token.
    fam, outs = family_of(family), []
    for i in range(next(iter(t.values())).shape[0]):
        o, state = fam.reference_step(state, {n: v[i] for n, v in t.items()}, P)
        outs.append(o)
    return torch.stack(outs), state


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


@dataclass
class DriveResult:
    max_out_err: float = 0.0
    max_state_err: float = 0.0
    max_ckpt_err: float = 0.0
    violations: list[str] = field(default_factory=list)
    coverage: set = field(default_factory=set)
    flushes: int = 0


def drive(kernel_cls, geometry, mode: str, decode: DecodeConfig, *, slots=(2, PAD_SLOT, 0), num_slots=4,
          steps=30, seed=0, origins=None, choose_k=None) -> DriveResult:
    """Run ``steps`` verify/commit steps, comparing every window output with the fp64 recurrence on
    prefix + window[0..s], the committed state after each commit, and the checkpoint after each
    flush.  ``choose_k(write_pos, T') -> k`` picks accepted counts (random when None)."""
    gen = torch.Generator().manual_seed(seed)
    params = make_params(geometry, gen)
    cfg = KernelConfig(geometry, params, mode, decode, num_slots=num_slots)
    kernel = kernel_cls(cfg)
    slot_ids = torch.tensor(slots, dtype=torch.int64)
    rows = len(slots)
    init = torch.randn((rows, *geometry.state_shape), generator=gen, dtype=torch.float64) * 0.5
    kernel.reset(slot_ids, init, None if origins is None else torch.tensor(origins))
    ref = [init[r].clone() for r in range(rows)]
    res = DriveResult()
    T = decode.window
    canary = {s for s in range(num_slots) if s not in slots}
    for step in range(steps):
        before = kernel.snapshot()
        inputs = make_inputs(geometry, rows, T, cfg.mode.act_dtype, gen)
        out = torch.full((rows, T, *geometry.out_shape), float("nan"), dtype=cfg.mode.act_dtype)
        kernel.verify(slot_ids, inputs, out)
        after = kernel.snapshot()
        ks = []
        for r, s in enumerate(slots):
            if s == PAD_SLOT:
                ks.append(1)
                if not torch.isnan(out[r]).all():
                    res.violations.append(f"step {step}: padding row {r} output written")
                continue
            wp = int(before.write_pos[s])
            flush = bool(before.is_flush[s])
            tok = {k: v[r] for k, v in inputs.items()}
            y, _ = reference_sequence(kernel.family, ref[r], tok, params)
            res.max_out_err = max(res.max_out_err, rel_err(out[r], y))
            if torch.isnan(out[r]).any():
                res.violations.append(f"step {step}: row {r} output not fully written")
            if not flush and kernel.kind == "replay" and not torch.equal(
                    before.checkpoint[s].view(torch.uint8), after.checkpoint[s].view(torch.uint8)):
                res.violations.append(f"step {step}: non-flush verify changed the checkpoint of slot {s}")
            k = choose_k(wp, T) if choose_k else int(torch.randint(1, T + 1, (1,), generator=gen))
            if flush and decode.speculative:
                res.max_ckpt_err = max(res.max_ckpt_err, rel_err(kernel.checkpoint_state(slot_ids)[r], ref[r]))
            res.coverage.add((wp, k, flush))
            res.flushes += flush
            ks.append(k)
            _, ref[r] = reference_sequence(kernel.family, ref[r], {n: v[:k] for n, v in tok.items()}, params)
        for s in canary:
            if not torch.equal(before.checkpoint[s].view(torch.uint8), after.checkpoint[s].view(torch.uint8)):
                res.violations.append(f"step {step}: unused slot {s} changed")
        kernel.commit(slot_ids, torch.tensor(ks))
        committed = kernel.committed_state(slot_ids)
        for r, s in enumerate(slots):
            if s != PAD_SLOT:
                res.max_state_err = max(res.max_state_err, rel_err(committed[r], ref[r]))
                if not decode.speculative and bool(before.is_flush[s]):
                    res.max_ckpt_err = max(res.max_ckpt_err,
                                           rel_err(kernel.checkpoint_state(slot_ids)[r], ref[r]))
    return res
