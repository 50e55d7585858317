"""Precision mutants of the gallery: storage formats, rounding and scales that differ from the declared mode.

Oracle: each mutant is a literal model (``replayssm/ops/*/literal.py``) plus exactly one deliberate
precision slip; a mutant whose bug only exists in some modes refuses the others through
``unsupported_reason`` (the fuzzer then draws only modes where the bug can show).  The tolerance
rule (factor x literal error + floor) must catch each.
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm.ops.mamba2 import literal as mamba2_literal
from replayssm.precision import STATE_FORMATS
from replayssm.rounding import INT8_MAX, philox_generator, quantize_state
from replayssm.validators.engine.mutants._common import DelegatingMath, WrapMath, only_modes
from replayssm.validators.engine.mutants.registry import register_mutant


class DecayRecordsBf16:
    """The decay records (Mamba-2 Δ, GDN g), meant to be kept in fp32, are stored in bf16."""

    def __init__(self, config):
        super().__init__(config)
        for name, (_shape, role) in self.layout.items():
            if role == "decay":
                self.records[name] = self.records[name].to(torch.bfloat16)


# From the formats table: the unscaled formats with stochastic rounding, the row-scaled ones.
_SR_STATES = tuple(f.name for f in STATE_FORMATS.values() if f.stochastic and not f.scaled)
_SCALED = tuple(f.name for f in STATE_FORMATS.values() if f.scaled)
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

    unsupported_reason = only_modes(_SR_STATES, stochastic=True, why="a biased stochastic rounding of bf16/fp16")

    def _store_state(self, slot, s, target, target_scale):
        target.copy_(_dithered_nearest(s, self.mode.state_dtype, self._generator(slot)))


class StaleRandomSeed:
    """Stochastic rounding keyed by (seed, slot) only: every flush of a sequence, and every sequence
    that reuses the slot, draws the same random numbers (a stale seed), so rounding errors stop
    averaging out (small increments are lost or doubled consistently)."""

    unsupported_reason = only_modes(stochastic=True, why="the random stream of stochastic rounding")

    def _generator(self, slot):
        return philox_generator(self.mode.seed, slot)


class _AtFlush:
    """Marks the verify's own stores (the flushes): reset stores the initial state as it is."""

    _in_verify = False

    def verify(self, slot_ids, inputs, out=None):
        self._in_verify = True
        try:
            return super().verify(slot_ids, inputs, out)
        finally:
            self._in_verify = False


class Fp8ScaleStaleAfterFlush(_AtFlush):
    """At a flush the checkpoint is quantized with a fresh per-row scale, but the scale tensor is
    not written back: the stored values are read with the previous (stale) scale."""

    unsupported_reason = only_modes(_SCALED, why="the per-row scales of fp8/int8 checkpoints")

    def _store_state(self, slot, s, target, target_scale):
        if not self._in_verify:
            return super()._store_state(slot, s, target, target_scale)
        stored, _fresh_scale = quantize_state(s, self.mode, self._generator(slot))
        target.copy_(stored)


class Fp8WrongByteOrder:
    """fp8 checkpoint bytes are written as 32-bit words in the wrong byte order: each group of 4
    consecutive fp8 values of a row is stored reversed, and read back as is."""

    unsupported_reason = only_modes(("fp8e4m3",), why="the byte layout of fp8 checkpoints")

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

    unsupported_reason = only_modes(("int8",), stochastic=False, why="the rounding of int8 checkpoints")

    def _store_state(self, slot, s, target, target_scale):
        s32 = s.to(torch.float32)
        amax = s32.abs().amax(dim=-1)
        scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        q = torch.trunc(s32 / scale.unsqueeze(-1)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        target.copy_(q)
        target_scale.copy_(scale)


class CheckpointBf16Precision(_AtFlush):
    """The declared fp32 checkpoint is kept at bf16 precision: every flush rounds the folded state
    to bf16 and stores the result in the fp32 container (every stored value bf16-exact)."""

    unsupported_reason = only_modes(("fp32",), why="an fp32 checkpoint kept at bf16 precision")

    def _store_state(self, slot, s, target, target_scale):
        if self._in_verify:
            s = s.to(torch.bfloat16).to(s.dtype)
        super()._store_state(slot, s, target, target_scale)


class FlushBf16Arithmetic(_AtFlush):
    """The flush folds at bf16-level accuracy but stores full fp32 values: each stored value is
    moved three quarters of the way to its bf16 neighbour (as a fold with bf16 decay weights
    would), so the values are off the bf16 grid and only the error added per flush shows it."""

    unsupported_reason = only_modes(("fp32",), why="an fp32 checkpoint folded at bf16-level accuracy")

    def _store_state(self, slot, s, target, target_scale):
        if self._in_verify:
            s = s + 0.75 * (s.to(torch.bfloat16).to(s.dtype) - s)
        super()._store_state(slot, s, target, target_scale)


class _WeightedInputBf16Math(DelegatingMath):
    """Mamba-2's fold with each token's weighted input ``Δ_j exp(A (c_n - c_j)) B_j`` rounded to bf16
    before its product with ``x_j`` (fp32 accumulation): the bf16 tensor-core operand of FlashInfer
    0.7.2's ``checkpointing_ssu`` fold (docs/findings.md, "FlashInfer 0.7.2.post1 on the H200")."""

    def fold(self, s0, hist, params, mode):
        delta = hist["dt"]
        if delta.shape[0] == 0:
            return s0
        total, seg = self.inner.decays(params["A"], delta, delta.shape[0] - 1)  # Mamba2Math's decay weights
        w = delta * seg  # [n, H]
        wB = (w[:, :, None] * mamba2_literal._per_head(hist["B"], s0.shape[0])).to(torch.bfloat16).to(s0.dtype)
        return total[:, None, None] * s0 + torch.einsum("jhp,jhn->hpn", hist["x"], wB)

    def window(self, s0, hist, win, params, mode, options, **conv):
        res = self.inner.window(s0, hist, win, params, mode, options, **conv)
        first = {k: torch.cat([hist[k], res.records[k][:1].to(hist[k].dtype)]) for k in hist}
        return dataclasses.replace(res, state_before=self.fold(s0, hist, params, mode),
                                   state_after_first=self.fold(s0, first, params, mode))


class FoldWeightedInputBf16(WrapMath):
    """The flush's fold rounds every folded token's weighted input to bf16 (an fp32 checkpoint then
    carries bf16-level error on each flush's new contributions; outputs read the exact window)."""

    unsupported_reason = only_modes(("fp32",), why="a fold with bf16 operands below an fp32 checkpoint")
    math_wrapper = _WeightedInputBf16Math


# ---- registration --------------------------------------------------------------------------------------
register_mutant(DecayRecordsBf16, "mutant-decay-records-bf16", "decay records (Δ, g) stored in bf16 instead of fp32",
                klass="precision", needs=("decay-records",))
register_mutant(BiasedStochasticRounding, "mutant-sr-biased",
                "stochastic rounding dithers then rounds to nearest: half an ulp of bias away from zero",
                klass="precision")
# GDN's stale seed shows only statistically; the ci profile's 100 derandomized scenarios stopped
# reaching it (89 of 100 before the serving strategies of issue 14 reshuffled the stream): CI catches
# it on a named scenario (tests/jobs/test_mutation_gallery.py::test_statistical_mutants_on_named_scenarios).
register_mutant(StaleRandomSeed, "mutant-sr-stale-seed",
                "stochastic rounding keyed by (seed, slot) only: the same random draws every flush and on slot reuse",
                klass="precision", gallery=("mamba2",))
register_mutant(Fp8ScaleStaleAfterFlush, "mutant-fp8-scale-stale",
                "fp8/int8 checkpoint: per-row scale not written back at a flush (stale scale)", klass="precision")
register_mutant(Fp8WrongByteOrder, "mutant-fp8-byte-order",
                "fp8 checkpoint written as 32-bit words in the wrong byte order (groups of 4 reversed)",
                klass="precision")
register_mutant(Int8Truncation, "mutant-int8-truncation",
                "int8 checkpoint quantized by truncation toward zero instead of round to nearest", klass="precision")

register_mutant(CheckpointBf16Precision, "mutant-checkpoint-bf16-precision",
                "declared fp32 checkpoint kept at bf16 precision (every flush stores bf16-exact values)",
                klass="precision")
register_mutant(FoldWeightedInputBf16, "mutant-fold-weighted-input-bf16",
                "Mamba-2 fold with each token's weighted input Δ exp(A Δc) B rounded to bf16 before the product "
                "with x (FlashInfer 0.7.2's checkpointing_ssu tensor-core fold)", klass="precision",
                needs=("weighted-input-fold",))
register_mutant(FlushBf16Arithmetic, "mutant-flush-bf16-arithmetic",
                "fp32 checkpoint folded at bf16-level accuracy (off the bf16 grid: each flush adds ~0.4 bf16 u)",
                klass="precision")

__all__: list[str] = []
