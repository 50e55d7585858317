"""The default judgement of a drift cell: what fails ``replayssm drift`` without ``--check``.

Oracle: the cell's own accumulators (:class:`~replayssm.validators.jobs.drift.analysis.BinnedCurve`
of the output, state and draft errors against the fp64 reference) and the Lockstep's exact
checks (``failure_counts``, ``failures``).  A cell fails when

* an output, draft output or state error is non-finite (NaN or inf: the kernel emitted or stored
  a non-finite value, or the reference saw one the kernel did not);
* an exact check failed (``non-finite``, ``unwritten-output``, ``padding-output``,
  ``window-tail``, ``out-param``: bookkeeping and interface invariants, never rounding; the
  tolerance checks of :data:`TOLERANCE_CHECKS` judge precision, which is ``--check``'s to judge);
* the peak binned RMS output or state error exceeds the gross bound of the cell's precision mode,
  ``min(2^GROSS_BITS u, max(GROSS_CAP, 2^GROSS_CAP_BITS u))`` (``u`` = the mode's unit roundoff,
  its coarsest rounding): 2^12 u = 2.4e-4 at s32a32, 1/2 at the bf16-activation modes (a relative
  error of 50 %), 8 at sfp8a16 (:data:`RULE`).

Expected error: correct kernels stay below 2^7 u at every mode.  Measured reason for the
constants: the largest peak over the drift records of correct kernels in docs/reports (110
cells; H100 and H200, 8 rows x 125,000 tokens, nano4b / qwen35-4b / kimi-linear-48b, every mode,
standard and speculative, long-memory) is 2^5.88 u (mamba2 triton-replay s32a32 spec-random,
3.43e-6, a bounded plateau); 2^2.70 u at the bf16-activation modes (mamba2 s16a16 spec-random,
0.0254); 2^4.48 u at sfp8a16 (mamba2 spec-random, 1.39: a correct fp8 state loses everything).
The literal models on a 2-core CPU (tiny, 2 rows x 512 tokens, standard decode,
all six scenarios, s32a32 and sfp8a16, mamba2 / gdn / kda; 2 x 1,024 tokens at s16a16 for gdn)
reach 2^6.62 u at most (mamba2 s32a32 large-delta, state 5.9e-6).  So the bound is x42 above the
worst correct fp32 error, x20 above the worst bf16-mode one, x5.7 above the worst fp8 one, and it
still fails a kernel whose relative error is 50 % at any mode but sfp8a16: a wrong readout, a
dropped term, a state from another sequence.  It is not a precision budget (``--check`` with
golden/tolerances.toml is).
"""

from __future__ import annotations

import numpy as np

from replayssm.validators.jobs.drift.analysis import BinnedCurve

GROSS_BITS = 12  # the bound: 2^12 u ...
GROSS_CAP = 0.5  # ... but at most a relative error of 1/2 ...
GROSS_CAP_BITS = 7  # ... unless 2^7 u is larger (fp8: correct kernels reach 1.4)
RULE = (f"2^{GROSS_BITS} x u capped at max({GROSS_CAP:g}, 2^{GROSS_CAP_BITS} x u), u the mode's unit roundoff")
# Checks whose verdict is a precision judgement (a tolerance against the literal model or the fp64
# running-error bound): ``--check`` fails on them, the default judgement does not.
TOLERANCE_CHECKS = frozenset({"output", "state", "flush-checkpoint", "flush-increment", "stored-precision"})


def gross_bound(mode) -> float:
    """The relative error no correct kernel reaches at ``mode`` (:data:`RULE`)."""
    u = mode.unit_roundoff
    return min(2.0 ** GROSS_BITS * u, max(GROSS_CAP, 2.0 ** GROSS_CAP_BITS * u))


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
    """``{"pass", "failures", "gross_bound"}`` of a raw cell result (``cells/<id>.json``)
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
                            f"of {mode.id} (u = {mode.unit_roundoff:.3g}) from {where}")
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
    return {"pass": not failures, "failures": failures, "gross_bound": bound}


__all__ = ["GROSS_BITS", "GROSS_CAP", "GROSS_CAP_BITS", "RULE", "TOLERANCE_CHECKS", "gross_bound", "judge"]
