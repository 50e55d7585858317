"""The mutation gallery: more broken kernels, each one bookkeeping or precision slip the fuzzer must catch.

Oracle: each mutant is a literal model (``replayssm/ops/*/naive.py``) plus exactly one deliberate
bug, from spec section 7 or a slip of the same kind.  Nothing here judges anything: the
validation engine (``validators/runner.py``) must fail every one of them, and
tests/test_mutation_gallery.py asserts that the Hypothesis fuzzer under the ``ci`` profile finds
a failing scenario for each and shrinks it (docs/mutation_gallery.md has the table).

Mutants register like the engine's own (``validators/mutants.py``, ``kind = "mutant"``) but into
:data:`GALLERY`, so they appear in ``replayssm list`` and run with ``replayssm validate --kernel``;
:func:`all_mutants` lists both sets.
A mutant whose bug only exists in some precision modes refuses the others through
``unsupported_reason`` (the fuzzer then draws only modes where the bug can show).

Mutants built on the literal *baseline* set ``base_kind = "baseline"`` so the runner applies the
baseline's checks to them (a baseline keeps no cursors).
"""

from __future__ import annotations

import contextlib

import torch

from replayssm.families import families
from replayssm.interface import PAD_SLOT, DecodeConfig
from replayssm.ops.gdn import literal as gdn_literal
from replayssm.ops.gdn import naive as gdn_naive
from replayssm.ops.literal import FamilyMath, WindowResult
from replayssm.ops.mamba2 import literal as mamba2_literal
from replayssm.registry import register
from replayssm.rounding import INT8_MAX, philox_generator, quantize_state
from replayssm.validators.mutants import BASES, MUTANTS, MutantSpec

# ---- helpers ------------------------------------------------------------------------------------------------


class _DelegatingMath(FamilyMath):
    """A FamilyMath that forwards everything to ``inner``; mutants override one method."""

    def __init__(self, inner: FamilyMath) -> None:
        self.inner = inner

    def record_layout(self, geometry):
        return self.inner.record_layout(geometry)

    def fold(self, s0, hist, params, mode):
        return self.inner.fold(s0, hist, params, mode)

    def window(self, s0, hist, win, params, mode, options):
        return self.inner.window(s0, hist, win, params, mode, options)

    def step(self, s, tok, params):
        return self.inner.step(s, tok, params)


class _WrapMath:
    """Mixin: the instance's ``math`` is ``math_wrapper(class math)``."""

    math_wrapper: type[_DelegatingMath]

    def __init__(self, config):
        super().__init__(config)
        self.math = self.math_wrapper(type(self).math)


def _only(states: tuple[str, ...] = (), stochastic: bool | None = None, why: str = ""):
    """An ``unsupported_reason`` refusing modes where the mutant's bug cannot exist."""

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if states and mode.state not in states:
            return f"this mutant's bug lives in {'/'.join(states)} state storage ({why})"
        if stochastic is not None and (mode.rounding == "stochastic") != stochastic:
            return f"this mutant's bug lives in {'stochastic' if stochastic else 'nearest'} rounding ({why})"
        return None

    return unsupported_reason


@contextlib.contextmanager
def _patched(module, name: str, value):
    """Temporarily replace a module global (the literal math calls ``softplus`` as one)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


# ---- bookkeeping mutants ---------------------------------------------------------------------------------------
class RingWrapOffByOne:
    """Ring row of logical position p: ``origin + p`` when it does not wrap, else ``origin + p + 1 - ring``
    (an off-by-one only past the ring's end)."""

    def _row_of(self, slot, p):
        q = self.origin[slot] + p
        rows = self.decode.ring_rows
        return q if q < rows else (q + 1) % rows


class _EarlyFlushDecode(DecodeConfig):
    def is_flush(self, write_pos: int) -> bool:
        return super().is_flush(write_pos + 1)

    def max_write_pos(self) -> int:
        return max(0, super().max_write_pos() - 1) if not self.speculative else super().max_write_pos()


class EarlyFlush:
    """The flush threshold is tested at ``write_pos + 1``: the checkpoint is rewritten one verify
    early (outputs stay right; the cursor rules and the checkpoint invariant break)."""

    def __init__(self, config):
        super().__init__(config)
        d = self.decode
        self.decode = _EarlyFlushDecode(d.decode, d.window, d.buffer)


class WindowWriteOffset:
    """Verify writes the window's records one ring row too far (logical write_pos + s + 1); reads are
    right, so the next verify reads a stale row at the first window position."""

    _shift = 0

    def _history(self, slot, n):
        self._shift = 0
        try:
            return super()._history(slot, n)
        finally:
            self._shift = 1

    def verify(self, slot_ids, inputs, out=None):
        try:
            return super().verify(slot_ids, inputs, out)
        finally:
            self._shift = 0

    def _row_of(self, slot, p):
        return super()._row_of(slot, p + self._shift)


class StaleCursorOnReuse:
    """reset() of a slot that was already admitted (slot reuse after preemption) loads the new
    initial state but keeps the previous sequence's write_pos and origin."""

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        old = {s: (self.write_pos[s], self.origin[s]) for s in ids if s != PAD_SLOT and self.ready[s]}
        super().reset(slot_ids, initial_state, origin)
        for s, (w, o) in old.items():
            self.write_pos[s], self.origin[s] = w, o


class _FoldsWindowToken(_DelegatingMath):
    def window(self, s0, hist, win, params, mode, options):
        res = self.inner.window(s0, hist, win, params, mode, options)
        return WindowResult(res.outputs, res.records, res.state_after_first, res.state_after_first)


class FlushFoldsWindowToken(_WrapMath):
    """A speculative flush folds window position 0 into the checkpoint too (the standard-decode
    rule), although that token is written to the ring again after the origin moves: it counts twice."""

    math_wrapper = _FoldsWindowToken


class BoundaryBackwardCopy:
    """Baseline speculative commit: when the accepted count lands exactly on the window boundary
    (k = T'), the accepted-state copy reads one draft state back (draft k-2)."""

    def commit(self, slot_ids, accepted):
        T = self.decode.window
        ks = accepted.clone()
        if self.decode.speculative and T >= 2:
            ks = torch.where(accepted == T, accepted - 1, accepted)
        super().commit(slot_ids, ks)


# ---- arithmetic mutants --------------------------------------------------------------------------------------------
class _ExclusiveCumsumMath(_DelegatingMath):
    """fold with an exclusive prefix sum of the log decays (Mamba-2 Δ, GDN g)."""

    def fold(self, s0, hist, params, mode):
        key = "dt" if "dt" in hist else "g"
        dec = hist[key]
        if dec.shape[0] == 0:
            return s0
        # The bug: c_j = sum_{i < j} instead of sum_{i <= j}.
        excl = torch.cumsum(dec, dim=0) - dec
        total = excl[-1]
        if key == "dt":
            A = params["A"]
            w = dec * torch.exp(A * (total - excl))
            Bh = mamba2_literal._per_head(hist["B"], s0.shape[0])
            return torch.exp(A * total)[:, None, None] * s0 + torch.einsum("jh,jhp,jhn->hpn", w, hist["x"], Bh)
        w = torch.exp(total - excl)
        kh = hist["k"].repeat_interleave(s0.shape[0] // hist["k"].shape[-2], dim=-2)
        return torch.exp(total)[:, None, None] * s0 + torch.einsum("jh,jhv,jhk->hvk", w, hist["d"], kh)


class ExclusiveCumsum(_WrapMath):
    """The history fold decays with an exclusive instead of inclusive prefix sum (flush checkpoint
    and committed state wrong; window outputs, computed separately, right)."""

    math_wrapper = _ExclusiveCumsumMath


def _tile_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, N] -> [..., heads, N] with head h using group h % G (the bug: tiling, not interleaving)."""
    reps = [1] * t.dim()
    reps[-2] = heads // t.shape[-2]
    return t.repeat(*reps)


class _TiledHeadsMath(_DelegatingMath):
    """Head h reads group (or key head) h % G instead of h // (H / G)."""

    def _expand(self, s0, d: dict, names) -> dict:
        return {k: (_tile_heads(v, s0.shape[0]) if k in names else v) for k, v in d.items()}

    def fold(self, s0, hist, params, mode):
        names = ("B",) if "B" in hist else ("k",)
        return self.inner.fold(s0, self._expand(s0, hist, names), params, mode)

    def window(self, s0, hist, win, params, mode, options):
        mamba = "B" in win
        res = self.inner.window(s0, self._expand(s0, hist, ("B",) if mamba else ("k",)),
                                self._expand(s0, win, ("B", "C") if mamba else ("q", "k")), params, mode, options)
        records = dict(res.records)
        if mamba:
            records["B"] = win["B"]
        else:
            records["k"] = gdn_naive.l2norm(win["k"])
        return WindowResult(res.outputs, records, self.fold(s0, hist, params, mode), res.state_after_first)


class TiledHeadGroups(_WrapMath):
    """Wrong head-to-group mapping: head h uses group h % G (Mamba-2 B, C) or key head h % H
    (GDN q, k) instead of h // (H / G)."""

    math_wrapper = _TiledHeadsMath


class DtBiasTwice:
    """dt_bias is added twice before the softplus (once by the caller, once in the kernel)."""

    def __init__(self, config):
        super().__init__(config)
        self.params = {**self.params, "dt_bias": 2 * self.params["dt_bias"]}


def _softplus_early_identity(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u > 2, u, torch.log1p(torch.exp(torch.clamp(u, max=2))))


class _SoftplusThresholdMath(_DelegatingMath):
    def window(self, s0, hist, win, params, mode, options):
        with _patched(mamba2_literal, "softplus", _softplus_early_identity), \
                _patched(gdn_naive, "softplus", _softplus_early_identity):
            return self.inner.window(s0, hist, win, params, mode, options)


class SoftplusThreshold(_WrapMath):
    """softplus switches to the identity for u > 2 instead of u > 20 (a threshold typed for a
    different dtype): Δ / the gate is off by log1p(exp(-u)) for 2 < u <= 20."""

    math_wrapper = _SoftplusThresholdMath


class _NoBetaSolveMath(_DelegatingMath):
    """GDN: the in-window WY/UT solve drops beta_i from the off-diagonal A_ij."""

    def window(self, s0, hist, win, params, mode, options):
        with _patched(gdn_literal, "gdn_window_solve", _solve_without_offdiag_beta):
            return self.inner.window(s0, hist, win, params, mode, options)


class SolveWithoutBeta(_WrapMath):
    """GDN speculative verify: the in-window solve builds A_ij = exp(G_i - G_j) (k_i . k_j) without
    beta_i, so every draft position after the first is wrong (T' >= 2)."""

    math_wrapper = _NoBetaSolveMath


def _solve_without_offdiag_beta(s_h, qh, kh, v, g, beta, mode=None):
    """gdn_window_solve with A_ij = exp(G_i - G_j) (k_i . k_j): beta only in R (the bug)."""
    T = qh.shape[0]
    G = torch.cumsum(g, dim=0)
    eG = torch.exp(G)
    sk = (s_h[None] * kh[:, :, None, :]).sum(-1)
    R = beta[..., None] * (v - eG[..., None] * sk)
    kk = torch.einsum("ihk,jhk->hij", kh, kh)
    decay = torch.exp(G.T[:, :, None] - G.T[:, None, :])
    d = []
    for i in range(T):
        acc = R[i]
        for j in range(i):
            acc = acc - (decay[:, i, j] * kk[:, i, j])[:, None] * d[j]
        d.append(acc)
    d = torch.stack(d)
    sq = (s_h[None] * qh[:, :, None, :]).sum(-1)
    kq = torch.einsum("jhk,shk->hsj", kh, qh)
    outs = []
    for s in range(T):
        o = eG[s][:, None] * sq[s]
        for j in range(s + 1):
            o = o + (decay[:, s, j] * kq[:, s, j])[:, None] * d[j]
        outs.append(o)
    return torch.stack(outs), d


# ---- precision mutants --------------------------------------------------------------------------------------------
class DecayRecordsBf16:
    """The decay records (Mamba-2 Δ, GDN g), meant to be kept in fp32, are stored in bf16."""

    def __init__(self, config):
        super().__init__(config)
        for name, (_shape, role) in self.layout.items():
            if role == "decay":
                self.records[name] = self.records[name].to(torch.bfloat16)


_SR_STATES = ("bf16", "fp16")
_SCALED = ("fp8e4m3", "int8")
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _dithered_nearest(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """The biased "stochastic rounding": add u * ulp (u uniform in [0, 1)) to |x|, then round to
    nearest.  Correct SR truncates after the dither; rounding to nearest adds half an ulp of bias
    away from zero on average."""
    mag = x.abs().to(torch.float32)
    near = mag.to(dtype)
    nxt = (near.view(_BITS[dtype]) + 1).view(dtype)
    ulp = (nxt.to(torch.float32) - near.to(torch.float32)).abs()
    u = torch.rand(mag.shape, generator=generator, dtype=torch.float64).to(torch.float32).to(x.device)
    out = (mag + u * ulp).to(dtype).to(torch.float32)
    out = torch.where(torch.isfinite(mag), out, near.to(torch.float32))
    return torch.where(x < 0, -out, out).to(dtype)


class BiasedStochasticRounding:
    """Stochastic rounding of the state adds the random dither and then rounds to nearest (instead
    of truncating): every stored value is biased half an ulp away from zero on average."""

    unsupported_reason = _only(_SR_STATES, stochastic=True, why="a biased stochastic rounding of bf16/fp16")

    def _store_state(self, slot, s, target, target_scale):
        target.copy_(_dithered_nearest(s, self.mode.state_dtype, self._generator(slot)))


class StaleRandomSeed:
    """Stochastic rounding keyed by (seed, slot) only: every flush of a sequence, and every sequence
    that reuses the slot, draws the same random numbers (a stale seed), so rounding errors stop
    averaging out (small increments are lost or doubled consistently)."""

    unsupported_reason = _only(stochastic=True, why="the random stream of stochastic rounding")

    def _generator(self, slot):
        return philox_generator(self.mode.seed, slot)


class Fp8ScaleStaleAfterFlush:
    """At a flush the checkpoint is quantized with a fresh per-row scale, but the scale tensor is
    not written back: the stored values are read with the previous (stale) scale."""

    unsupported_reason = _only(_SCALED, why="the per-row scales of fp8/int8 checkpoints")
    _in_verify = False

    def verify(self, slot_ids, inputs, out=None):
        self._in_verify = True
        try:
            return super().verify(slot_ids, inputs, out)
        finally:
            self._in_verify = False

    def _store_state(self, slot, s, target, target_scale):
        if not self._in_verify:
            return super()._store_state(slot, s, target, target_scale)
        stored, _fresh_scale = quantize_state(s, self.mode, self._generator(slot))
        target.copy_(stored)


class Fp8WrongByteOrder:
    """fp8 checkpoint bytes are written as 32-bit words in the wrong byte order: each group of 4
    consecutive fp8 values of a row is stored reversed, and read back as is."""

    unsupported_reason = _only(("fp8e4m3",), why="the byte layout of fp8 checkpoints")

    def _store_state(self, slot, s, target, target_scale):
        stored, scale = quantize_state(s, self.mode, self._generator(slot))
        n = stored.shape[-1]
        bits = stored.view(torch.uint8)
        parts = [bits[..., i:i + 4].flip(-1) for i in range(0, n, 4)]
        target.copy_(torch.cat(parts, dim=-1).view(stored.dtype))
        if target_scale is not None:
            target_scale.copy_(scale)


class Int8Truncation:
    """int8 checkpoints are quantized by truncation toward zero instead of rounding to nearest:
    every flush loses half a quantization step on average, always toward zero."""

    unsupported_reason = _only(("int8",), stochastic=False, why="the rounding of int8 checkpoints")

    def _store_state(self, slot, s, target, target_scale):
        s32 = s.to(torch.float32)
        amax = s32.abs().amax(dim=-1)
        scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        q = torch.trunc(s32 / scale.unsqueeze(-1)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        target.copy_(q)
        target_scale.copy_(scale)


# ---- registration ----------------------------------------------------------------------------------------------
_BASELINES = {name: fam.literal_baseline for name, fam in families().items()}
SPEC_ONLY = ("speculative",)


def _register_family_mutant(mixin: type, name: str, description: str, *, families=("mamba2", "gdn"),
                            base: str = "replay", decodes=("speculative", "standard")) -> MutantSpec:
    """Register ``mixin`` on the literal replay (or baseline) model of each family in ``families``,
    with ``kind = "mutant"``, into the registry and :data:`GALLERY` (the engine's own seven stay in
    ``mutants.MUTANTS``)."""
    bases = BASES if base == "replay" else _BASELINES
    classes = {}
    for fam in families:
        attrs = {"name": name, "family": fam, "kind": "mutant", "description": description,
                 "literal_twin": "literal-baseline" if base == "baseline" else "literal-replay",
                 "base_kind": base, "__module__": __name__}
        classes[fam] = register(type(f"{mixin.__name__}_{fam}", (mixin, bases[fam]), attrs), replace=True)
    spec = MutantSpec(name, description, tuple(decodes), None, classes)
    GALLERY[name] = spec
    return spec


GALLERY: dict[str, MutantSpec] = {}
# Which failure class of spec 7 (or which slip) each gallery mutant stands for.
GALLERY_CLASSES: dict[str, str] = {}


def _add(mixin, name, description, klass, **kw):
    _register_family_mutant(mixin, name, description, **kw)
    GALLERY_CLASSES[name] = klass


_add(RingWrapOffByOne, "mutant-ring-wrap-off-by-one",
     "ring row off by one for logical positions past the ring's end (origin + p >= ring)", "bookkeeping",
     decodes=SPEC_ONLY)
_add(EarlyFlush, "mutant-early-flush", "flush tested at write_pos + 1: the checkpoint is rewritten one verify early",
     "bookkeeping")
_add(WindowWriteOffset, "mutant-window-write-offset",
     "window records written one ring row too far (write_pos + s + 1)", "bookkeeping", decodes=SPEC_ONLY)
_add(StaleCursorOnReuse, "mutant-stale-cursor-on-reuse",
     "reset of a reused slot keeps the previous sequence's write_pos and origin", "bookkeeping")
_add(FlushFoldsWindowToken, "mutant-flush-folds-window-token",
     "speculative flush folds window position 0 into the checkpoint as well (counted twice)", "bookkeeping",
     decodes=SPEC_ONLY)
_add(BoundaryBackwardCopy, "mutant-boundary-backward-copy",
     "baseline: when k lands on the window boundary (k = T') the accepted-state copy reads draft k-2",
     "bookkeeping", base="baseline", decodes=SPEC_ONLY)
_add(ExclusiveCumsum, "mutant-exclusive-cumsum",
     "history fold decays with an exclusive instead of inclusive prefix sum", "arithmetic")
_add(TiledHeadGroups, "mutant-tiled-head-groups",
     "head h uses group h % G (tiled) instead of h // (H/G) (Mamba-2 B/C, GDN q/k)", "arithmetic")
_add(DtBiasTwice, "mutant-dt-bias-twice", "dt_bias added twice before the softplus", "arithmetic")
_add(SoftplusThreshold, "mutant-softplus-threshold",
     "softplus switches to the identity above 2 instead of 20", "arithmetic")
_add(SolveWithoutBeta, "mutant-solve-without-beta",
     "GDN in-window WY/UT solve drops beta_i from the off-diagonal", "arithmetic", families=("gdn",),
     decodes=SPEC_ONLY)
_add(DecayRecordsBf16, "mutant-decay-records-bf16", "decay records (Δ, g) stored in bf16 instead of fp32",
     "precision")
_add(BiasedStochasticRounding, "mutant-sr-biased",
     "stochastic rounding dithers then rounds to nearest: half an ulp of bias away from zero", "precision")
_add(StaleRandomSeed, "mutant-sr-stale-seed",
     "stochastic rounding keyed by (seed, slot) only: the same random draws every flush and on slot reuse",
     "precision")
_add(Fp8ScaleStaleAfterFlush, "mutant-fp8-scale-stale",
     "fp8/int8 checkpoint: per-row scale not written back at a flush (stale scale)", "precision")
_add(Fp8WrongByteOrder, "mutant-fp8-byte-order",
     "fp8 checkpoint written as 32-bit words in the wrong byte order (groups of 4 reversed)", "precision")
_add(Int8Truncation, "mutant-int8-truncation",
     "int8 checkpoint quantized by truncation toward zero instead of round to nearest", "precision")


def all_mutants() -> dict[str, MutantSpec]:
    """Every broken kernel: the engine's (``mutants.MUTANTS``) and this gallery's."""
    return {**MUTANTS, **GALLERY}


__all__ = ["GALLERY", "GALLERY_CLASSES", "all_mutants"]
