"""The tolerance rule, and its one table of factors and floors per precision mode.

Oracle (docs/validation.md, borrowed from FlashAttention's tests): a kernel's error against the fp64
reference may be at most ``factor`` times the error of the literal model run at the same
precision mode, plus a floor::

    err_kernel <= factor * err_literal + floor_u * u * scale

``err`` is the max abs error of one row's window outputs (or of one row's state), ``u`` the
mode's unit roundoff (outputs) or its state/compute unit roundoff (states), ``scale`` the max
|reference| of that row (for outputs, at least the magnitude of the terms the readout sums,
``runner.readout_magnitude``: an output small after cancellation still moves by u times its
terms).  With stochastic rounding the kernel's rounding stream is independent of the literal's,
so ``err_literal`` is the running maximum, per row since its last reset, over the literal and
``runner.SR_REPLICAS`` replicas with other rounding seeds, and the floor grows like a random walk
(``sqrt(1 + flushes)``, flushes capped at ``runner.SR_WALK_CAP``).  All of this was found
necessary by the fuzzer: its nightly runs failed correct kernels before (docs/fuzzing.md).
A kernel that breaks the rule computes or stores something at a lower effective precision than
its declared mode (or is wrong): the report says so.

Factor and floor were measured on tiny, 40-60 steps, every standard mode, both families
(tests/test_runner.py::test_tolerance_table_separates_legit_variants): legitimate alternative
implementations (the Mamba-2 state_and_output route against the output_only literal; the literal
replay with an independent stochastic-rounding stream) reach at most 0.67 of the bound, while a
state stored one format lower (fp32->bf16, 16-bit->fp8, fp8->fp4) reaches 1.1 to 10^6 of it --
except GDN at s32a16, whose bf16 d records already carry bf16-level state error (0.78).
The Triton kernels (mamba2 triton-replay, -state, -baseline; gdn triton-baseline and
triton-replay), run through the Triton interpreter on CPU on 2026-11-29, reached at most 0.70 of
the bound (s32a32, per-row schedule, 20 steps); tf32 readouts and the GPU's approximate exp are
not covered by that measurement: a GPU run must confirm the fp32 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from replayssm.precision import PrecisionMode, parse_mode


@dataclass(frozen=True)
class Tolerance:
    factor: float
    floor_u: float
    why: str


# FlashAttention uses factor 2.  The floor (in units of the mode's u, relative to the row's
# max |reference|) absorbs a literal error that happens to be ~0 at one row: 4 u is two
# roundings of the output/state, measured largest-legit-ratio below 0.6 of the bound on tiny.
_DEFAULT = Tolerance(2.0, 4.0, "FlashAttention's factor 2; floor = two roundings of the coarsest format")

# Keyed by state and activation dtype (dot precision and rounding change u, not the rule).
TABLE: dict[tuple[str, str], Tolerance] = {
    ("fp64", "fp64"): Tolerance(2.0, 64.0, "reference mode: fp64 round-off of the different summation "
                                            "orders of the replay fold (~1e-14), 64 u"),
    ("fp32", "fp32"): _DEFAULT,
    ("fp32", "bf16"): _DEFAULT,
    ("fp32", "fp16"): _DEFAULT,
    ("bf16", "bf16"): _DEFAULT,
    ("fp16", "bf16"): _DEFAULT,
    ("fp16", "fp16"): _DEFAULT,
    # fp8's u (2^-4) is 16x bf16's: a 4 u floor (25 % of the row maximum) let a state stored in
    # fp4 e2m1 pass (worst ratio 0.6); at 1 u the legit variants stay below 0.25 of the bound.
    ("fp8e4m3", "bf16"): Tolerance(2.0, 1.0, "factor 2; floor one fp8 rounding (u = 2^-4 is already coarse)"),
    ("int8", "bf16"): _DEFAULT,
}


def tolerance_for(mode: PrecisionMode | str) -> Tolerance:
    m = parse_mode(mode)
    return TABLE.get((m.state, m.act), _DEFAULT)


def output_unit(mode: PrecisionMode | str) -> float:
    """The u output errors are measured in: the coarsest rounding of the mode."""
    return parse_mode(mode).unit_roundoff


def state_unit(mode: PrecisionMode | str) -> float:
    """The u state errors are measured in: state storage or arithmetic, whichever is coarser.  The
    readout dot is left out (a ``-tf32`` mode loosens the output checks, never the state's): where a
    family builds its state through the dot, the literal model rounds it the same way and the
    ``factor x err_literal`` term carries it."""
    m = parse_mode(mode)
    return max(m.state_unit_roundoff, m.arith_unit_roundoff)


def bound(mode: PrecisionMode | str, err_literal, scale, *, state: bool = False):
    """``factor * err_literal + floor_u * u * scale`` (floats or tensors)."""
    t = tolerance_for(mode)
    u = state_unit(mode) if state else output_unit(mode)
    return t.factor * err_literal + t.floor_u * u * scale


__all__ = ["TABLE", "Tolerance", "bound", "output_unit", "state_unit", "tolerance_for"]
