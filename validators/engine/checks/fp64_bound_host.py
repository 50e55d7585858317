"""The fp64 running-error bound's window on host arrays: drift's eager fast path on a CPU.

Oracle: :meth:`replayssm.validators.engine.checks.fp64_bound.RunningBound.window` with ``outputs_only=True``.
Expected difference: none.  Every value is the same IEEE binary64 product, sum, maximum or selection,
in the same order, as the torch expressions of ``fp64_bound.py`` (NumPy and torch do the same
correctly rounded operation; no transcendental is evaluated here -- the token coefficients come in
already computed, on the shapes the window gives them).  tests/test_fp64_bound_host.py compares the
two bit for bit, and tests/jobs/test_drift_fast.py the fast path that uses it with the slow path.

Why: on a CPU the window is ~265 torch calls per step on ``[rows, heads]`` tensors, each a few
microseconds of dispatch for a few dozen flops; a NumPy operation on arrays that small costs a
fraction of one.
"""

from __future__ import annotations

import numpy as np
import torch

from replayssm.validators.engine.checks.fp64_bound import FACTOR, K_EXP, K_STORE, K_SUM, RunningBound


def _fold(bound: RunningBound, st: dict) -> np.ndarray:
    return bound.u_c * (K_SUM * st["n"] + K_EXP * st["L"]) * st["M"]


def _stored(bound: RunningBound, st: dict, rows: np.ndarray | None) -> dict:
    """``RunningBound.stored`` (``rows``: a bool ``[R]`` mask, None for every row)."""
    fold = _fold(bound, st)
    E = st["E"] + fold + K_STORE * bound.u_s * st["M"]
    A = st["A"] + fold
    if rows is None:
        z = np.zeros_like(st["n"])
        return {"E": E, "A": A, "M": st["M"], "n": z, "L": z.copy()}
    sel = rows[:, None]
    return {"E": np.where(sel, E, st["E"]), "A": np.where(sel, A, st["A"]), "M": st["M"],
            "n": np.where(sel, 0.0, st["n"]), "L": np.where(sel, 0.0, st["L"])}


def window_outputs(bound: RunningBound, coef: dict[str, np.ndarray], weights: np.ndarray, flush: np.ndarray,
                   speculative: bool, accepted: np.ndarray | None) -> np.ndarray:
    """``bound.window(..., outputs_only=True)["output"]`` ``[R, T']``, ``bound.cur`` advanced as it advances
    it: ``coef`` the window tokens' :meth:`RunningBound.coefficients` stacked ``[T', R, H]`` (host arrays),
    ``weights`` their output weights ``[T', R, H]``, ``flush`` the bool ``[R]`` rows whose verify stores a
    checkpoint, ``accepted`` ``[R]`` (None: every row keeps the whole window)."""
    st = {k: v.numpy() for k, v in bound.cur.items()}
    if bound.replay and speculative:
        st = _stored(bound, st, flush)
    kept, out = st, []
    for t in range(weights.shape[0]):
        rho, norm = coef["rho"][t], st["M"]
        new = rho * norm + coef["c"][t]
        rec = coef["p"][t] * (coef["q"][t] + rho * norm) if "p" in coef else np.zeros_like(new)
        st = {"E": rho * st["E"] + bound.u_a * rec, "A": rho * st["A"], "M": new, "n": st["n"] + 1,
              "L": st["L"] + coef["dL"][t]}
        if not bound.replay:
            st = _stored(bound, st, None)
        elif t == 0 and not speculative:
            st = _stored(bound, st, flush)
        out.append(((st["E"] + _fold(bound, st)) * weights[t]).max(-1))
        if accepted is None:
            kept = st
        else:
            sel = (accepted == t + 1)[:, None]
            kept = {k: np.where(sel, st[k], kept[k]) for k in st}
    bound.cur = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in kept.items()}
    return FACTOR * np.stack(out, axis=1)


__all__ = ["window_outputs"]
