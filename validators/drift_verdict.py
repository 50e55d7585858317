"""The default judgement of a drift cell: what fails ``replayssm drift`` without ``--check``.

Oracle: the cell's own accumulators (:class:`~replayssm.validators.drift_analysis.BinnedCurve`
of the output, state and draft errors against the fp64 reference) and the Lockstep's exact
checks (``failure_counts``, ``failures``).  A cell fails when

* an output, draft output or state error is non-finite (NaN or inf: the kernel emitted or stored
  a non-finite value, or the reference saw one the kernel did not);
* an exact check failed (``non-finite``, ``unwritten-output``, ``padding-output``,
  ``window-tail``, ``out-param``: bookkeeping and interface invariants, never rounding; the
  tolerance checks of :data:`TOLERANCE_CHECKS` judge precision, which is ``--check``'s to judge);
* the peak binned RMS output or state error exceeds the gross bound
  ``2^GROSS_BITS x u`` of the cell's precision mode (``u`` = the mode's unit roundoff, its
  coarsest rounding: 2^-24 for s32a32, 2^-8 for the bf16-activation modes, 2^-4 for sfp8a16).

Expected error: correct kernels stay below ``2^6 u``.  Measured reason for ``GROSS_BITS = 7``:
the largest peak over every drift record of a correct kernel in docs/reports (110 cells; H100
and H200, 8 rows x 125,000 tokens, nano4b / qwen35-4b / kimi-linear-48b, every mode, standard
and speculative) is 2^5.88 u (mamba2 triton-replay s32a32 long-memory spec-random, 3.43e-6, a
bounded plateau); the literal models on the CPU over all six scenarios reach less (the
calibration in tests/test_drift_runner.py).  2^7 u is x2.2 above that plateau and still fails a
kernel whose relative error is 50 % at any bf16-activation mode (2^7 x 2^-8 = 0.5): a wrong
readout, a dropped term, a state from another sequence.  The bound is not a precision budget
(``--check`` with golden/tolerances.toml is); at sfp8a16 it is 8 (800 %) because a correct fp8
state reaches 140 % itself.
"""

from __future__ import annotations

import numpy as np

from replayssm.validators.drift_analysis import BinnedCurve

GROSS_BITS = 7
# Checks whose verdict is a precision judgement (a tolerance against the literal model or the fp64
# running-error bound): ``--check`` fails on them, the default judgement does not.
TOLERANCE_CHECKS = frozenset({"output", "state", "flush-checkpoint", "flush-increment", "stored-precision"})


def gross_bound(mode) -> float:
    """The relative error no correct kernel reaches at ``mode``: ``2^GROSS_BITS x mode.unit_roundoff``."""
    return 2.0 ** GROSS_BITS * mode.unit_roundoff


def _first_bin_over(curve: BinnedCurve, bound: float) -> tuple[int, int] | None:
    """Token range ``(first, last)`` of the first log bin whose RMS error exceeds ``bound``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = np.sqrt(curve.sumsq / curve.count)
    over = np.nonzero((curve.count > 0) & (rms > bound))[0]
    if not over.size:
        return None
    i = int(over[0])
    return int(curve.edges[i]), int(curve.edges[i + 1]) - 1


def judge(cell: dict, mode) -> dict:
    """``{"pass", "failures", "gross_bound", "gross_bits"}`` of a raw cell result (``cells/<id>.json``)
    at precision mode ``mode``; each failure is one sentence naming the token (or step) and what."""
    bound = gross_bound(mode)
    failures = []
    curves = {k: BinnedCurve.from_dict(v) for k, v in cell["curves"].items() if k in ("output", "draft", "state")}
    for what, key in (("output", "output"), ("draft output", "draft"), ("state", "state")):
        c = curves.get(key)
        if c is None:
            continue
        if c.nonfinite:
            failures.append(f"non-finite {what} from token {int(c.first_nonfinite):,} "
                            f"({c.nonfinite:,} non-finite sample(s))")
        if key == "draft":
            continue
        span = _first_bin_over(c, bound)
        if span is not None:
            where = f"token {span[0]:,}" if span[0] == span[1] else f"tokens {span[0]:,}-{span[1]:,}"
            failures.append(f"{what} error {c.peak_rms():.3g} (peak binned RMS) above the gross bound {bound:.3g} "
                            f"(2^{GROSS_BITS} x u = {mode.unit_roundoff:.3g} of {mode.id}) from {where}")
    first = {}
    for f in cell.get("failures") or []:
        first.setdefault(f.get("check"), f)
    for name, n in sorted((cell.get("failure_counts") or {}).items()):
        if name in TOLERANCE_CHECKS:
            continue
        f = first.get(name)
        at = "" if f is None else (f", first at step {f.get('step')}, row {f.get('row')}"
                                   f"{'' if f.get('position') is None else ', window position ' + str(f['position'])}"
                                   f": {f.get('message', '')}")
        failures.append(f"exact check {name!r} failed {n} time(s){at}")
    return {"pass": not failures, "failures": failures, "gross_bound": bound, "gross_bits": GROSS_BITS}


__all__ = ["GROSS_BITS", "TOLERANCE_CHECKS", "gross_bound", "judge"]
