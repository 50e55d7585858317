"""The fp64 running-error bound: the tolerance that applies on every step the literal model is not run.

Oracle: a running-error analysis (Higham, "Accuracy and Stability of Numerical Algorithms", 3.3)
of the recurrence, computed in fp64 beside the reference from the reference's own quantities,
per row and head, never from the kernel under test.  The family's literal math gives, per token,
its state-free coefficients ``error_coefficients(tok, params, heads) -> {rho, c[, p, q][, dL]}``,
read by :func:`norm_terms` on a state norm bound ``M``: the factor ``rho`` an existing state error
is scaled by, the bound ``rho M + c`` on the new state's norm (the sum of absolute contributions),
the size ``p (q + rho M)`` of the contributions built from records rounded to the activation format
(none without ``p``), and the token's decay exponent ``dL`` the fold's cumulative sums carry (a
family whose decay is not one scalar per head -- KDA's per-channel gates -- gives the largest over
channels; ``-log rho`` when left out).  The coefficients depend on the tokens alone, so drift's
fast path computes a chunk's at once and scans the recurrence on the device
(``replayssm/ops/triton/bound_scan.py``, the same bits as :meth:`RunningBound.window`).  With ``u_c`` the
compute format's u, ``u_a`` the activation format's and ``u_s`` the state format's:

* a checkpoint carries ``E`` (the error folded into it, scaled by ``rho`` every token, plus
  ``u_a x rec`` for every rounded record appended after it);
  (records a family builds by reading the state through the readout dot, capability
  ``state-read-records``, use the dot's u where coarser: the fold's own ``u_c`` leaves the dot out);
* the fold of the ``n`` records since the checkpoint adds ``u_c (K_SUM n + K_EXP L) norm``,
  where ``L`` is the decay exponent summed since the checkpoint (cumulative sums of decays carry
  an absolute error ~u L into exp, the error of the cumulative-sum-then-exp route);
* storing a state (a flush of a replay kernel, every token of a baseline) adds ``K_STORE u_s
  norm`` (doubled with stochastic rounding) and starts a new fold; the initial state is stored
  once at reset.

The state bound of a row is ``FACTOR x`` the largest head bound; the output bound is the
family's readout magnitude of that state bound (``runner.readout_magnitude`` on a state of
per-head bound values), plus the tolerance rule's floor.  ``fold_terms`` (``K_SUM n + K_EXP L`` of
a flush's fold) and ``fold_abs`` (the same times ``u_c M``, in absolute terms: it holds where the
fold's contributions cancel) size the arithmetic the ``flush-increment`` check allows.
Expected: a correct kernel stays below it at every mode (measured in ``tests/engine/test_fp64_bound.py``);
a state stored one format coarser than declared exceeds it wherever the declared format's u
dominates the bound (an fp32 state whose records are exact inputs: Mamba-2; GDN's own bf16 d
records make its state bound bf16-level at s32a16, where the stored-precision checks name the
coarser state instead).
"""

from __future__ import annotations

import functools
import inspect

import torch

from replayssm.families import Family
from replayssm.precision import PrecisionMode
from replayssm.validators.engine.resolved import family_of

# Constants of the bound (the rounding-error counts of the analysis above, with room for the
# orders of operation real kernels use).  Measured on tiny, literal_every=0 (this
# bound alone), both families, s32a32 / s32a16 / s16a16 / sfp8a16, speculative exhaustive and
# standard, five input distributions, 30 steps, random initial state: literal-replay and
# literal-baseline reach at most 0.31 of it; the legitimate variants registered beside the
# literal models (literal-replay-state, -cumprod, -cumsum-exp, gdn -recurrent, and weights in
# fp64, measured then unregistered to keep CI small), s32a32 / s32a16 / s16a16, three schedules,
# 20 steps, at most 0.34 (tests/engine/test_fp64_bound.py and tests/core/test_variants.py keep a subset).
K_SUM = 2.0  # relative error of an n-term fp32 sum of non-negative-bounded terms: ~n u (gamma_n)
K_EXP = 2.0  # exp(x + dx) = exp(x)(1 + dx): |dx| <= u L for each of the two cumulative sums
K_STORE = 1.0  # one rounding to the state format (relative to the element, <= the head norm)
FACTOR = 2.0  # FlashAttention's factor 2, here on a bound that is already a worst case


def error_model(fam: Family | str, conv=None):
    """The family's (``fam``: the family or its name) ``error_coefficients`` (from its literal math), or None
    when it gives none;
    ``conv``: the kernel's declared conventions, bound where the coefficients take them (KDA's gate
    law changes the decays the bound is made of)."""
    fn = getattr(family_of(fam).literal_replay.math, "error_coefficients", None)
    if fn is not None and conv is not None and not conv.is_default and "conv" in inspect.signature(fn).parameters:
        return functools.partial(fn, conv=conv)
    return fn


def norm_terms(coef: dict, norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rho, norm', rec, dL)`` of one token from its coefficients (:meth:`RunningBound.coefficients`)
    and the state norm bound ``norm`` before it: the error factor, the new norm bound ``rho norm + c``,
    the rounded records' size ``p (q + rho norm)`` (zero without ``p``) and the decay exponent."""
    rho = coef["rho"]
    new = rho * norm + coef["c"]
    rec = coef["p"] * (coef["q"] + rho * norm) if "p" in coef else torch.zeros_like(new)
    return rho, new, rec, coef["dL"]


def state_norm(state: torch.Tensor) -> torch.Tensor:
    """Per row and head: the largest 2-norm over the state's last dimension (>= max |S|)."""
    return state.norm(dim=-1).flatten(2).amax(-1)


class RunningBound:
    """The fp64 running-error bound of one run (per row and head: carried error ``E``, the
    carried error of the arithmetic alone ``A``, norm bound ``M``, tokens ``n`` and decay
    exponent ``L`` since the last stored state).

    ``A`` leaves out the storage and record roundings: it bounds how far a correct kernel with
    another operation order may differ from the literal model, which rounds its storage the same
    way (the envelope of ``tolerance_rule.py``)."""

    def __init__(self, terms, mode: PrecisionMode, replay: bool, rows: int, heads: int, device,
                 records_read_state: bool = False) -> None:
        self.terms, self.heads = terms, heads
        self.replay = replay
        # The fold is fp32 arithmetic whatever the readout dot: a -tf32 mode loosens outputs only.
        self.u_c = mode.arith_unit_roundoff
        # Records built by reading the state through the dot (``records_read_state``, a delta rule's
        # d = beta (v - S k)) carry the dot's rounding of S k: |k| = 1, so within u_dot p (q + rho M).
        self.u_a = max(mode.act_unit_roundoff, mode.dot_unit_roundoff if records_read_state else 0.0)
        self.u_s = mode.state_unit_roundoff * (2.0 if mode.rounding == "stochastic" else 1.0)
        z = torch.zeros(rows, heads, dtype=torch.float64, device=device)
        self.cur = {"E": z, "A": z.clone(), "M": z.clone(), "n": z.clone(), "L": z.clone()}

    # ---- the analysis ------------------------------------------------------------------------------
    def _fold(self, st: dict) -> torch.Tensor:
        return self.u_c * (K_SUM * st["n"] + K_EXP * st["L"]) * st["M"]

    def value(self, st: dict) -> torch.Tensor:
        """Per row and head: the bound on the error of the state ``st`` describes."""
        return st["E"] + self._fold(st)

    def value_arith(self, st: dict) -> torch.Tensor:
        """... of its arithmetic alone."""
        return st["A"] + self._fold(st)

    def stored(self, st: dict, rows: torch.Tensor | None = None, fold: torch.Tensor | None = None) -> dict:
        """``st`` after storing the state (rows where ``rows`` is True; all when None); ``fold``
        is ``self._fold(st)`` when the caller has it."""
        fold = self._fold(st) if fold is None else fold
        E = st["E"] + fold + K_STORE * self.u_s * st["M"]
        A = st["A"] + fold
        if rows is None:
            z = torch.zeros_like(st["n"])
            return {"E": E, "A": A, "M": st["M"], "n": z, "L": z.clone()}
        sel = rows[:, None]
        return {"E": torch.where(sel, E, st["E"]), "A": torch.where(sel, A, st["A"]), "M": st["M"],
                "n": st["n"].masked_fill(sel, 0.0), "L": st["L"].masked_fill(sel, 0.0)}

    def _store_fold(self, st: dict, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """A flush's fold of ``st``: its ``fold_terms`` and ``fold_abs`` (per row) and the state
        after storing it on rows ``rows``, sharing one evaluation of the fold."""
        terms = K_SUM * st["n"] + K_EXP * st["L"]
        fold = self.u_c * terms * st["M"]
        return terms.amax(-1), fold.amax(-1), self.stored(st, rows, fold)

    def coefficients(self, tok: dict, params: dict) -> dict:
        """The family's error coefficients of tokens ``tok`` (fp64, any leading shape), with the decay
        exponent ``dL`` filled in where the family leaves it out."""
        coef = self.terms(tok, params, self.heads)
        if "dL" not in coef:
            coef["dL"] = -torch.log(coef["rho"].clamp_min(1e-300))
        return coef

    def scan_constants(self, device) -> torch.Tensor:
        """The analysis's constants as ``ops/triton/bound_scan.py`` reads them (fp64, in its order)."""
        return torch.tensor([self.u_c, self.u_a, K_STORE * self.u_s, K_SUM, K_EXP, FACTOR], dtype=torch.float64,
                            device=device)

    def advance(self, st: dict, tok: dict, params: dict, coef: dict | None = None) -> dict:
        """``st`` over one token ``tok`` (``coef``: its :meth:`coefficients`, when the caller has them)."""
        rho, M, rec, dL = norm_terms(self.coefficients(tok, params) if coef is None else coef, st["M"])
        return {"E": rho * st["E"] + self.u_a * rec, "A": rho * st["A"], "M": M, "n": st["n"] + 1,
                "L": st["L"] + dL}

    # ---- the run ------------------------------------------------------------------------------------
    def reset(self, rows: list[int], init: torch.Tensor) -> None:
        """Rows ``rows`` start from ``init`` (their initial state, stored once)."""
        idx = torch.tensor(rows, dtype=torch.long, device=init.device)
        M = state_norm(init.index_select(0, idx).to(torch.float64))
        z = torch.zeros_like(M)
        fresh = self.stored({"E": z, "A": z, "M": M, "n": z, "L": z})
        for k, v in fresh.items():
            self.cur[k].index_copy_(0, idx, v)

    @staticmethod
    def weights(tok: dict, like: torch.Tensor, readout) -> torch.Tensor:
        """Per token, row and head the largest output weight ``w`` of the readout magnitude (see
        :meth:`window`) for tokens ``tok`` stacked ``[N, R, ...]``, in one readout call over the
        ``N x R`` rows (the weights depend on the tokens alone, so a chunk's are computed at once):
        ``[N, R, H]``, what :meth:`window` takes as ``weights``."""
        N, R = next(iter(tok.values())).shape[:2]
        flat = {k: v.reshape(N * R, *v.shape[2:]) for k, v in tok.items()}
        return RunningBound._weights(flat, *RunningBound._units(N * R, like), readout).view(N, R, -1)

    @staticmethod
    def _units(rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A unit and a zero state of bound values, ``[rows, H, 1, ...]`` (``like``: a state)."""
        one = torch.ones((rows, like.shape[1]) + (1,) * (like.dim() - 2), dtype=torch.float64, device=like.device)
        return one, torch.zeros_like(one)

    @staticmethod
    def _weights(tok: dict, one: torch.Tensor, zero: torch.Tensor, readout) -> torch.Tensor:
        return (readout(one, tok) - readout(zero, tok)).flatten(2).amax(-1)

    def window(self, toks: list[dict], params: dict, flush: torch.Tensor, speculative: bool,
               accepted: torch.Tensor | None, like: torch.Tensor, readout, weights=None,
               outputs_only: bool = False, discard: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Advance over the window tokens ``toks`` (fp64, all rows); ``flush`` [R] marks the rows
        whose verify stores a checkpoint; ``like`` is a state (for its shape); ``readout(s_abs,
        tok)`` the family's readout magnitude.  Keeps the bound after each row's ``accepted``
        prefix; returns per row the bounds (``FACTOR`` included) on each window output ``output``
        [R, T'], on the state after the accepted prefix ``state`` [R] and on a checkpoint written
        by this verify ``checkpoint`` [R]; the same of the arithmetic alone (``*_arith``; the output's
        also per head, ``output_arith_heads`` [R, T', H]: the mixer level's norm is per head); and
        ``fold_terms`` of the fold a flush stores, and ``fold_abs`` its arithmetic's absolute
        bound ``u_c (K_SUM n + K_EXP L) M`` (largest over heads).  ``weights``: the tokens' output
        weights from :meth:`weights` (``[T', R, H]``; None: computed here, token by token, the same
        values); ``outputs_only``: return ``output`` alone (what drift's fast path reads);
        ``accepted`` None: every row keeps the whole window (no selection); ``discard`` [R] (a staged
        fold's commit(0), ``zero_accept = "staged"``): those rows keep the bound they had before the
        verify, their flush's fold thrown away as the kernel throws it away."""
        st = start = self.cur
        ckpt = terms = fold_abs = None
        if self.replay and speculative:
            terms, fold_abs, st = self._store_fold(st, flush)
            ckpt = st
        kept, out, out_a, out_ah = st, [], [], []
        units = self._units(like.shape[0], like) if weights is None else None
        # The readout magnitude is linear in the state and the state of bound values is constant
        # per head, so per token one readout of a unit state [R, H, 1, ...] (broadcast by the
        # family's readout) less its state-free part gives each head's largest output weight ``w``,
        # and a head's output bound is its state bound times ``w``: no state-sized fp64 pass, and
        # the bound and its arithmetic share the weights and the fold (the same maximum as the
        # state-shaped expansion; fewer device operations per token, tools/drift_ops.py).
        for t, tok in enumerate(toks):
            st = self.advance(st, tok, params)
            if not self.replay:
                st = self.stored(st)
            elif t == 0 and not speculative:
                terms, fold_abs, st = self._store_fold(st, flush)
                ckpt = st
            w = self._weights(tok, *units, readout) if weights is None else weights[t]
            fm = self._fold(st)
            out.append(((st["E"] + fm) * w).amax(-1))
            out_ah.append((st["A"] + fm) * w)
            out_a.append(out_ah[-1].amax(-1))
            if accepted is None:
                kept = st
            else:
                sel = (accepted == t + 1)[:, None]
                kept = {k: torch.where(sel, st[k], kept[k]) for k in st}
        if discard is not None:
            kept = {k: torch.where(discard.view(-1, *([1] * (kept[k].dim() - 1))), start[k], kept[k]) for k in kept}
        self.cur = kept
        if outputs_only:
            return {"output": FACTOR * torch.stack(out, dim=1)}
        if ckpt is None:
            ckpt = kept
        if terms is None:
            terms, fold_abs = self.fold_terms(kept), self._fold(kept).amax(-1)
        return {"output": FACTOR * torch.stack(out, dim=1), "state": FACTOR * self.value(kept).amax(-1),
                "checkpoint": FACTOR * ckpt["E"].amax(-1),
                "output_arith": FACTOR * torch.stack(out_a, dim=1),
                "output_arith_heads": FACTOR * torch.stack(out_ah, dim=1),
                "state_arith": FACTOR * self.value_arith(kept).amax(-1),
                "checkpoint_arith": FACTOR * ckpt["A"].amax(-1), "fold_terms": terms, "fold_abs": fold_abs}

    @staticmethod
    def fold_terms(st: dict) -> torch.Tensor:
        """Per row: ``K_SUM n + K_EXP L`` of the fold ``st`` describes (largest over heads)."""
        return (K_SUM * st["n"] + K_EXP * st["L"]).amax(-1)

    def state_dict(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.cur.items()}

    def load_state_dict(self, d: dict) -> None:
        self.cur = {k: v.to(self.cur[k].device) for k, v in d.items()}


__all__ = ["FACTOR", "K_EXP", "K_STORE", "K_SUM", "RunningBound", "error_model", "norm_terms", "state_norm"]
