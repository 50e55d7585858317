"""Drift analysis: name the growth law of an error curve and answer budget questions with it.

Oracle: ordinary least squares on the logarithm of log-binned RMS errors (each decade of tokens
weighs the same; rounding noise is multiplicative), models compared by the small-sample Akaike
criterion AICc (or BIC), Wilcoxon signed-rank / Mann-Whitney tests from scipy.stats.
Expected error: on synthetic curves of a known law with 30 % multiplicative noise the law is
recovered and its rate parameter lies within a few standard errors of the truth
(tests/jobs/test_drift_analysis.py); that is the only accuracy claim made here.

Growth laws (``t`` in tokens, all parameters positive; ``e0`` is the floor every run has, the
output rounding for instance):

* ``bounded``: ``e = c`` (constant), or ``e = sqrt(e0^2 + s^2 (1 - exp(-(t / tau)^p)))`` with
  ``tau <= t_max / 3`` and ``0.5 <= p <= 2.5`` -- an error that forgets (decay < 1) and whose
  plateau is *visible* within the run; ``p = 1`` is a random walk that forgets (rising like
  sqrt(t) first), other ``p`` let the rise be steeper or flatter than sqrt(t) before the plateau
  (measured on the H200: an fp32 checkpoint error rising like t^0.8 for three decades, then flat).
  A curve still rising at the end of the run is not called bounded.
* ``sqrt``: ``e = sqrt(e0^2 + a^2 t)`` -- unbiased rounding accumulating like a random walk.
* ``linear``: ``e = e0 + b t`` -- biased rounding.
* ``exponential``: ``e = e0 + c (exp(lam t) - 1)`` -- an instability.

Special outcomes: ``exact`` (every error is 0) and ``nonfinite`` (NaN or inf somewhere).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

LAWS = ("bounded", "sqrt", "linear", "exponential")
OUTCOMES = LAWS + ("exact", "nonfinite")
CRITERIA = ("aic", "bic")

_TINY = 1e-300


# ---- binning ------------------------------------------------------------------------------------------

def bin_edges(t_max: float, nbins: int = 48) -> np.ndarray:
    """Integer-valued, log-spaced bin edges covering token positions 1..t_max (last edge exclusive)."""
    if not isinstance(nbins, int) or nbins < 2:
        raise ValueError(f"nbins: expected an integer >= 2, got {nbins!r}")
    if not t_max >= 1:
        raise ValueError(f"t_max: expected a largest token position >= 1, got {t_max!r}")
    edges = np.unique(np.floor(np.geomspace(1.0, float(t_max) + 1.0, nbins + 1)))
    return edges if len(edges) > 1 else np.array([1.0, 2.0])


@dataclass
class BinnedCurve:
    """A streaming, log-binned error curve: per bin the sum of squared errors, the sample count
    and the sum of log positions.  Samples are accumulated in call order (fp64, deterministic),
    so a run resumed from :meth:`to_dict` continues bit for bit."""

    edges: np.ndarray
    sumsq: np.ndarray
    count: np.ndarray
    sumlogt: np.ndarray
    peak: float = 0.0  # largest single error seen
    nonfinite: int = 0  # samples that were NaN or inf
    first_nonfinite: float | None = None  # smallest position with a non-finite error
    t_seen: float = 0.0  # largest position seen

    @classmethod
    def new(cls, t_max: float, nbins: int = 48) -> BinnedCurve:
        e = bin_edges(t_max, nbins)
        n = len(e) - 1
        return cls(e, np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n))

    def add(self, t, err) -> None:
        """Accumulate errors ``err`` at positions ``t`` (positions outside the edges are ignored)."""
        t = np.asarray(t, dtype=np.float64).ravel()
        e = np.asarray(err, dtype=np.float64).ravel()
        if t.shape != e.shape:
            raise ValueError(f"err: expected as many errors as positions ({t.size}), got {e.size}")
        keep = (t >= self.edges[0]) & (t < self.edges[-1])
        t, e = t[keep], e[keep]
        if t.size == 0:
            return
        bad = ~np.isfinite(e)
        if bad.any():
            self.nonfinite += int(bad.sum())
            first = float(t[bad].min())
            self.first_nonfinite = first if self.first_nonfinite is None else min(first, self.first_nonfinite)
            t, e = t[~bad], e[~bad]
        if t.size == 0:
            return
        if np.any(e < 0):
            raise ValueError("err: expected errors >= 0")
        n = len(self.count)
        idx = np.clip(np.searchsorted(self.edges, t, side="right") - 1, 0, n - 1)
        self.sumsq += np.bincount(idx, weights=e * e, minlength=n)
        self.count += np.bincount(idx, minlength=n)
        self.sumlogt += np.bincount(idx, weights=np.log(t), minlength=n)
        self.peak = max(self.peak, float(e.max()))
        self.t_seen = max(self.t_seen, float(t.max()))

    def add_each(self, t, err, group) -> None:
        """``add(t[group == g], err[group == g])`` for g = 0, 1, ... in turn, bit for bit, in one pass
        (``group`` non-decreasing integers): each group's per-bin sums start from zero and are
        summed in element order, as ``add`` does, and are accumulated group after group."""
        t = np.asarray(t, dtype=np.float64).ravel()
        e = np.asarray(err, dtype=np.float64).ravel()
        g = np.asarray(group, dtype=np.int64).ravel()
        if not t.shape == e.shape == g.shape:
            raise ValueError(f"err, group: expected as many errors and groups as positions ({t.size}), "
                             f"got {e.size} and {g.size}")
        keep = (t >= self.edges[0]) & (t < self.edges[-1])
        t, e, g = t[keep], e[keep], g[keep]
        bad = ~np.isfinite(e)
        if bad.any():
            self.nonfinite += int(bad.sum())
            first = float(t[bad].min())
            self.first_nonfinite = first if self.first_nonfinite is None else min(first, self.first_nonfinite)
            t, e, g = t[~bad], e[~bad], g[~bad]
        if t.size == 0:
            return
        if np.any(e < 0):
            raise ValueError("err: expected errors >= 0")
        n = len(self.count)
        _, g = np.unique(g, return_inverse=True)  # groups left empty add nothing
        m = int(g[-1]) + 1
        flat = g * n + np.clip(np.searchsorted(self.edges, t, side="right") - 1, 0, n - 1)
        for name, w in (("sumsq", e * e), ("sumlogt", np.log(t))):
            per = np.bincount(flat, weights=w, minlength=m * n).reshape(m, n)
            acc = np.add.accumulate(np.concatenate([getattr(self, name)[None], per]), axis=0)
            setattr(self, name, acc[-1])
        self.count += np.bincount(flat, minlength=m * n).reshape(m, n).sum(0)
        self.peak = max(self.peak, float(e.max()))
        self.t_seen = max(self.t_seen, float(t.max()))

    def add_groups(self, items) -> None:
        """``add(t, err)`` for each ``(t, err)`` of ``items`` in turn, bit for bit, in one :meth:`add_each` pass."""
        t = [np.asarray(ti, dtype=np.float64).ravel() for ti, _ in items]
        e = [np.asarray(ei, dtype=np.float64).ravel() for _, ei in items]
        for i, (a, b) in enumerate(zip(t, e)):
            if a.shape != b.shape:
                raise ValueError(f"err: expected as many errors as positions ({a.size}) in item {i}, got {b.size}")
        if t:
            self.add_each(np.concatenate(t), np.concatenate(e), np.repeat(np.arange(len(t)), [a.size for a in t]))

    @property
    def samples(self) -> int:
        return int(self.count.sum()) + self.nonfinite

    def binned(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t_bin, rms, count)`` over the non-empty bins."""
        keep = self.count > 0
        c = self.count[keep]
        return np.exp(self.sumlogt[keep] / c), np.sqrt(self.sumsq[keep] / c), c

    def peak_rms(self) -> float:
        """The largest binned RMS error (inf when a sample was non-finite): the budget metric."""
        if self.nonfinite:
            return math.inf
        _, rms, _ = self.binned()
        return float(rms.max()) if rms.size else 0.0

    def rms(self, t_from: float = 0.0) -> float | None:
        """RMS error over the bins whose mean position is >= ``t_from``."""
        tb, _, c = self.binned()
        keep = self.count > 0
        sel = tb >= t_from
        if not sel.any():
            return None
        return float(math.sqrt(self.sumsq[keep][sel].sum() / c[sel].sum()))

    def to_dict(self) -> dict:
        return {"edges": self.edges.tolist(), "sumsq": self.sumsq.tolist(), "count": self.count.tolist(),
                "sumlogt": self.sumlogt.tolist(), "peak": self.peak, "nonfinite": self.nonfinite,
                "first_nonfinite": self.first_nonfinite, "t_seen": self.t_seen}

    @classmethod
    def from_dict(cls, d: dict) -> BinnedCurve:
        try:
            return cls(np.array(d["edges"], dtype=np.float64), np.array(d["sumsq"], dtype=np.float64),
                       np.array(d["count"], dtype=np.int64), np.array(d["sumlogt"], dtype=np.float64),
                       float(d["peak"]), int(d["nonfinite"]), d["first_nonfinite"], float(d["t_seen"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"curve: expected a BinnedCurve dict, missing or bad field {e}") from None


def log_bins(t, err, nbins: int = 48) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Aggregate a per-sample error curve into log-spaced token bins.

    ``t`` (token positions, >= 1) and ``err`` (errors >= 0) are flat arrays of equal length; samples
    may repeat a position (several rows).  Returns ``(t_bin, rms, count)`` over the non-empty bins:
    the geometric-mean position, the RMS error and the number of samples of each bin.
    """
    curve = _curve_of(t, err, nbins)
    return curve.binned()


def _curve_of(t, err, nbins: int) -> BinnedCurve:
    t = np.asarray(t, dtype=np.float64).ravel()
    e = np.asarray(err, dtype=np.float64).ravel()
    if t.shape != e.shape:
        raise ValueError(f"err: expected as many errors as positions ({t.size}), got {e.size}")
    if t.size == 0:
        raise ValueError("t: expected at least one sample, got none")
    if np.any(t < 1) or not np.all(np.isfinite(t)):
        raise ValueError("t: expected finite token positions >= 1")
    curve = BinnedCurve.new(float(t.max()), nbins)
    curve.add(t, e)
    return curve


# ---- the laws -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Model:
    name: str  # "constant", "saturating", "sqrt", "linear", "exponential"
    law: str
    params: tuple[str, ...]

    def f(self, t: np.ndarray, p: np.ndarray) -> np.ndarray:
        if self.name == "constant":
            return np.full_like(t, p[0])
        if self.name == "saturating":
            e0, s, tau, rise = p
            return np.sqrt(e0 * e0 + s * s * -np.expm1(-np.power(t / tau, rise)))
        if self.name == "sqrt":
            e0, a = p
            return np.sqrt(e0 * e0 + a * a * t)
        if self.name == "linear":
            e0, b = p
            return e0 + b * t
        e0, c, lam = p
        return e0 + c * np.expm1(np.minimum(lam * t, 700.0))


_MODELS = (
    _Model("constant", "bounded", ("c",)),
    _Model("saturating", "bounded", ("e0", "s", "tau", "p")),
    _Model("sqrt", "sqrt", ("e0", "a")),
    _Model("linear", "linear", ("e0", "b")),
    _Model("exponential", "exponential", ("e0", "c", "lam")),
)
_BY_NAME = {m.name: m for m in _MODELS}


@dataclass
class LawFit:
    """One model fitted to a binned curve.  ``params``/``stderr`` in natural units."""

    model: str
    law: str
    params: dict[str, float]
    stderr: dict[str, float]
    rss: float
    n: int
    aic: float
    bic: float

    def predict(self, t) -> np.ndarray:
        p = np.array([self.params[k] for k in _BY_NAME[self.model].params])
        return _BY_NAME[self.model].f(np.asarray(t, dtype=np.float64), p)

    def to_dict(self) -> dict:
        return {"model": self.model, "law": self.law, "params": _clean(self.params),
                "stderr": _clean(self.stderr), "rss": _num(self.rss), "n": self.n,
                "aic": _num(self.aic), "bic": _num(self.bic)}


def _num(x):
    return float(x) if x is not None and math.isfinite(x) else None


def _clean(d: dict) -> dict:
    return {k: _num(v) for k, v in d.items()}


def _starts(model: _Model, t: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    tmax, y0, y1 = t.max(), max(y[0], _TINY), max(y[-1], _TINY)
    ymin = max(y.min(), _TINY)
    lo = max(ymin, y0)
    if model.name == "constant":
        return [np.array([np.exp(np.mean(np.log(y)))])]
    if model.name == "saturating":
        return [np.array([lo * f, y1, tmax * g, r]) for f in (0.3, 1.0) for g in (0.01, 0.1, 0.3) for r in (1.0, 1.6)]
    if model.name == "sqrt":
        return [np.array([lo * f, max(y1 / math.sqrt(tmax), _TINY) * g]) for f in (0.3, 1.0) for g in (0.3, 1.0)]
    if model.name == "linear":
        return [np.array([lo * f, max(y1 / tmax, _TINY) * g]) for f in (0.3, 1.0) for g in (0.3, 1.0)]
    return [np.array([lo, max(y1 - lo, lo) / math.expm1(k), k / tmax]) for k in (0.5, 3.0, 10.0)]


def _bounds(model: _Model, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = len(model.params)
    lo, hi = np.full(k, -np.inf), np.full(k, np.inf)
    tmax = t.max()
    if model.name == "saturating":
        lo[2], hi[2] = math.log(min(t.min(), tmax / 3) / 10.0), math.log(tmax / 3.0)
        lo[3], hi[3] = math.log(0.5), math.log(2.5)
    if model.name == "exponential":
        lo[2], hi[2] = math.log(1e-3 / tmax), math.log(50.0 / tmax)
    return lo, hi


def _fit_model(model: _Model, t: np.ndarray, y: np.ndarray) -> LawFit:
    ly = np.log(y)
    k, n = len(model.params), len(t)
    lo, hi = _bounds(model, t)

    def resid(q):
        return np.log(np.maximum(model.f(t, np.exp(q)), _TINY)) - ly

    best = None
    for p0 in _starts(model, t, y):
        q0 = np.clip(np.log(np.maximum(p0, _TINY)), lo + 1e-9, hi - 1e-9)
        try:
            r = optimize.least_squares(resid, q0, bounds=(lo, hi), method="trf", x_scale=1.0, max_nfev=2000)
        except (ValueError, FloatingPointError):
            continue
        if best is None or r.cost < best.cost:
            best = r
    if best is None:
        raise RuntimeError(f"fit of the {model.name} law failed from every start")
    q = best.x
    rss = float(2.0 * best.cost)
    dof = max(n - k, 1)
    s2 = rss / dof
    J = best.jac
    try:
        cov_q = np.linalg.inv(J.T @ J) * s2
        se_q = np.sqrt(np.maximum(np.diag(cov_q), 0.0))
    except np.linalg.LinAlgError:
        se_q = np.full(k, np.inf)
    p = np.exp(q)
    se = p * se_q  # delta method from log-parameters
    rss_floor = max(rss, n * 1e-30)
    aic = n * math.log(rss_floor / n) + 2 * k + (2 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf)
    bic = n * math.log(rss_floor / n) + k * math.log(n)
    return LawFit(model.name, model.law, dict(zip(model.params, map(float, p))),
                  dict(zip(model.params, map(float, se))), rss, n, aic, bic)


@dataclass
class GrowthFit:
    """The outcome of :func:`fit_growth`."""

    law: str
    criterion: str
    best: LawFit | None
    fits: dict[str, LawFit] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)  # Akaike/Schwarz weights per law
    exponent: float | None = None  # local power-law slope d log e / d log t over the last decade
    exponent_stderr: float | None = None
    t_max: float = 0.0
    e_last: float | None = None  # RMS error over the last decade of tokens
    bins: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def saturation(self) -> float | None:
        """The plateau a bounded curve saturates at; None for growing (or exact) curves."""
        if self.law != "bounded" or self.best is None:
            return None
        p = self.best.params
        return p["c"] if "c" in p else math.sqrt(p["e0"] ** 2 + p["s"] ** 2)

    def predict(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        if self.law == "exact":
            return np.zeros_like(t)
        if self.best is None:
            return np.full_like(t, np.nan)
        return self.best.predict(t)

    def to_dict(self) -> dict:
        return {
            "law": self.law, "criterion": self.criterion,
            "model": None if self.best is None else self.best.model,
            "params": None if self.best is None else _clean(self.best.params),
            "stderr": None if self.best is None else _clean(self.best.stderr),
            "weights": _clean(self.weights),
            "fits": {k: v.to_dict() for k, v in self.fits.items()},
            "exponent": _num(self.exponent), "exponent_stderr": _num(self.exponent_stderr),
            "saturation": _num(self.saturation), "t_max": float(self.t_max), "e_last": _num(self.e_last),
        }


def fit_growth(t, err=None, *, criterion: str = "aic", nbins: int = 48) -> GrowthFit:
    """Fit every law to an error curve and choose one.

    The curve is either raw samples (``t`` token positions, ``err`` errors) or a
    :class:`BinnedCurve` passed as ``t``.  ``criterion``: ``"aic"`` (small-sample AICc) or
    ``"bic"``.  Needs at least 6 non-empty bins of positive error (fewer: ValueError).  Within a
    law the better of its models (constant or saturating for bounded) represents it.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion: expected one of {CRITERIA}, got {criterion!r}")
    curve = t if isinstance(t, BinnedCurve) else _curve_of(t, err, nbins)
    t_max = curve.t_seen
    if curve.nonfinite:
        return GrowthFit("nonfinite", criterion, None, t_max=max(t_max, curve.first_nonfinite or 0.0))
    if curve.samples == 0:
        raise ValueError("t: expected at least one sample, got none")
    if curve.peak == 0.0:
        return GrowthFit("exact", criterion, None, t_max=t_max, e_last=0.0)
    tb, yb, _ = curve.binned()
    pos = yb > 0
    tb, yb = tb[pos], yb[pos]
    if len(tb) < 6:
        raise ValueError(f"t: need errors over at least 6 log-spaced token bins to fit a law, got {len(tb)} "
                         f"(run more tokens)")
    fits = {m.name: _fit_model(m, tb, yb) for m in _MODELS}
    score = {k: getattr(f, criterion) for k, f in fits.items()}
    per_law: dict[str, str] = {}
    for name, f in fits.items():
        if f.law not in per_law or score[name] < score[per_law[f.law]]:
            per_law[f.law] = name
    law_score = {law: score[name] for law, name in per_law.items()}
    smin = min(law_score.values())
    w = {law: math.exp(-0.5 * (s - smin)) for law, s in law_score.items()}
    tot = sum(w.values())
    weights = {law: w[law] / tot for law in LAWS}
    law = min(law_score, key=law_score.get)
    # Local exponent over the last decade (at least the last 6 bins).
    sel = tb >= t_max / 10.0
    if sel.sum() < 6:
        sel = np.zeros_like(tb, dtype=bool)
        sel[-6:] = True
    reg = stats.linregress(np.log(tb[sel]), np.log(yb[sel]))
    return GrowthFit(law, criterion, fits[per_law[law]], {k: fits[v] for k, v in per_law.items()}, weights,
                     float(reg.slope), float(reg.stderr), t_max, curve.rms(t_max / 10.0), (tb, yb))


# ---- budgets -------------------------------------------------------------------------------------------

def tokens_to_budget(fit: GrowthFit, budget: float, t=None, err=None, nbins: int = 48) -> dict:
    """Tokens until the error crosses ``budget``.

    ``predicted``: from the fitted law (``inf`` when it never does, 0 when it starts above);
    ``predicted_stderr``: delta method over the fit's parameter uncertainties;
    ``observed``: first log-bin position whose RMS error exceeds the budget (None if none),
    when the curve is given (raw ``t``/``err``, or a :class:`BinnedCurve` as ``t``).
    """
    if not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"budget: expected a positive error level, got {budget!r}")
    observed = None
    if t is not None:
        curve = t if isinstance(t, BinnedCurve) else _curve_of(t, err, nbins)
        tb, yb, _ = curve.binned()
        over = np.nonzero(yb > budget)[0]
        observed = float(tb[over[0]]) if over.size else None
        if curve.first_nonfinite is not None:
            observed = curve.first_nonfinite if observed is None else min(observed, curve.first_nonfinite)
    if fit.law == "nonfinite":
        return {"budget": budget, "predicted": 0.0, "predicted_stderr": None, "observed": observed}
    if fit.law == "exact":
        return {"budget": budget, "predicted": math.inf, "predicted_stderr": None, "observed": observed}
    pred = _crossing(fit.best.model, fit.best.params, budget)
    se = None
    if 0 < pred < math.inf:
        m = _BY_NAME[fit.best.model]
        p = np.array([fit.best.params[k] for k in m.params])
        sp = np.array([fit.best.stderr[k] for k in m.params])
        if np.all(np.isfinite(sp)):
            g = np.zeros(len(p))
            for i in range(len(p)):
                h = 1e-6 * p[i]
                q = p.copy()
                q[i] += h
                v = _crossing(m.name, dict(zip(m.params, q)), budget)
                g[i] = (v - pred) / h if math.isfinite(v) else np.nan
            if np.all(np.isfinite(g)):
                se = float(np.sqrt(np.sum((g * sp) ** 2)))
    return {"budget": budget, "predicted": float(pred), "predicted_stderr": se, "observed": observed}


def _crossing(model: str, p: dict, b: float) -> float:
    if model == "constant":
        return 0.0 if p["c"] >= b else math.inf
    if model == "saturating":
        e0, s, tau, rise = p["e0"], p["s"], p["tau"], p["p"]
        if e0 >= b:
            return 0.0
        frac = (b * b - e0 * e0) / (s * s)
        return math.inf if frac >= 1.0 else tau * (-math.log1p(-frac)) ** (1.0 / rise)
    if model == "sqrt":
        e0, a = p["e0"], p["a"]
        return 0.0 if e0 >= b else (b * b - e0 * e0) / (a * a)
    if model == "linear":
        return 0.0 if p["e0"] >= b else (b - p["e0"]) / p["b"]
    e0, c, lam = p["e0"], p["c"], p["lam"]
    return 0.0 if e0 >= b else math.log1p((b - e0) / c) / lam


def predict_at(fit: GrowthFit, horizon: float) -> float:
    """The fitted error at ``horizon`` tokens (inf for a nonfinite run)."""
    if fit.law == "nonfinite":
        return math.inf
    return float(fit.predict(np.array([float(horizon)]))[0])


# ---- per-flush error -----------------------------------------------------------------------------------

def injected_per_flush(flush_index, state_err, local_err=None, *, local_rms: float | None = None) -> dict:
    """Error injected by one flush.

    ``local_err`` (optional): the measured one-flush errors -- the checkpoint a flush writes,
    against the fp64 fold of the *kernel's own* previous checkpoint over the same tokens.  Their
    RMS is the direct estimate (or pass that RMS as ``local_rms``).  Without it, the estimate
    comes from the accumulated state error ``E_f`` at flush ``f``: while the state has not
    forgotten, independent per-flush errors add in quadrature, ``E_f^2 ~ f delta^2``, so ``delta``
    is the square root of the least-squares slope of ``E_f^2`` on ``f`` over the first eighth of
    the flushes (at least 8) -- an underestimate when the state forgets quickly.
    """
    f = np.asarray(flush_index, dtype=np.float64).ravel()
    e = np.asarray(state_err, dtype=np.float64).ravel()
    if f.shape != e.shape:
        raise ValueError(f"state_err: expected one error per flush index ({f.size}), got {e.size}")
    out = {"flushes": int(np.unique(f).size), "first_flush": None, "from_growth": None, "local_rms": None,
           "local_median": None, "estimate": None, "basis": None}
    if f.size == 0:
        return out
    if np.any(f < 1):
        raise ValueError("flush_index: expected flush counts >= 1")
    first = e[f == f.min()]
    out["first_flush"] = float(np.sqrt(np.mean(first * first)))
    if np.all(np.isfinite(e)):
        cut = max(8.0, f.max() / 8.0)
        sel = f <= cut
        ff, ee = f[sel], e[sel]
        slope = float(np.sum(ff * ee * ee) / np.sum(ff * ff))
        out["from_growth"] = math.sqrt(max(slope, 0.0))
    if local_err is not None:
        le = np.asarray(local_err, dtype=np.float64).ravel()
        if le.size:
            out["local_rms"] = float(np.sqrt(np.mean(le * le)))
            out["local_median"] = float(np.median(le))
    if local_rms is not None and out["local_rms"] is None:
        out["local_rms"] = float(local_rms)
    if out["local_rms"] is not None:
        out["estimate"], out["basis"] = out["local_rms"], "local"
    elif out["from_growth"] is not None:
        out["estimate"], out["basis"] = out["from_growth"], "growth"
    return out


# ---- speculation ---------------------------------------------------------------------------------------

def _row_blocks(x: np.ndarray, block: int) -> np.ndarray:
    """``[rows, n_blocks]`` means of log-error over ``block`` consecutive samples of each row
    (NaN samples are missing values; a block of only missing values is NaN)."""
    x = np.asarray(x, dtype=np.float64)
    x = x.reshape(1, -1) if x.ndim < 2 else x.reshape(-1, x.shape[-1])
    lx = np.where(np.isnan(x), np.nan, np.log(np.maximum(x, _TINY)))
    return _coarsen(lx, block)


def _coarsen(x: np.ndarray, k: int) -> np.ndarray:
    n = (x.shape[1] // k) * k
    if k == 1 or n == 0:
        return x if k == 1 else x.reshape(x.shape[0], -1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x[:, :n].reshape(x.shape[0], n // k, k), axis=2)


def _lag1(x: np.ndarray) -> float:
    """Pooled lag-1 autocorrelation of the rows of ``x`` (row means removed; NaN pairs skipped)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        c = x - np.nanmean(x, axis=1, keepdims=True)
    a, b = c[:, :-1].ravel(), c[:, 1:].ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    den = float(np.sum(c[np.isfinite(c)] ** 2))
    if ok.sum() < 3 or den == 0:
        return 0.0
    return float(np.sum(a[ok] * b[ok]) / den)


def compare_speculative(err_standard, err_speculative, *, block: int = 64, alpha: float = 0.01,
                        paired: bool | None = None, max_autocorr: float = 0.2) -> dict:
    """Does speculation add error?  One-sided test that speculative errors exceed standard ones.

    Inputs are per-token errors ``[rows, tokens]`` (or flat, one row); NaN marks a missing value.
    Per-token errors are autocorrelated (they share a state), so the test runs on means of
    log-error over blocks of ``block`` tokens of a row, and consecutive blocks are merged
    pairwise until the pooled lag-1 autocorrelation of each run's block series is at most
    ``max_autocorr`` (or fewer than 4 blocks per row would remain): ``block_level`` says how
    many input blocks one tested block holds.  Inputs may also be per-block geometric-mean
    errors already (pass ``block=1``).  When both runs cover the same accepted positions
    (``paired``; default: when the shapes are equal) the blocks are paired and the test is
    Wilcoxon's signed-rank on block differences; otherwise Mann-Whitney U on block means.
    ``ratio`` is the geometric-mean error ratio speculative / standard with a 95 % interval and
    one at the test's level (``ratio_ci_test``, ``1 - 2 alpha`` two-sided: its lower end is the
    one-sided bound); speculation adds error when the test and that interval both say so,
    ``inconclusive`` when only one does.
    """
    a = np.asarray(err_standard, dtype=np.float64)
    b = np.asarray(err_speculative, dtype=np.float64)
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block: expected a positive integer, got {block!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha!r}")
    if not 0 <= max_autocorr < 1:
        raise ValueError(f"max_autocorr: expected a value in [0, 1), got {max_autocorr!r}")
    if a.size == 0 or b.size == 0:
        raise ValueError("err_standard/err_speculative: expected non-empty error arrays")
    if np.any(np.isinf(a)) or np.any(np.isinf(b)):
        return {"test": None, "paired": None, "n_blocks": 0, "p_value": None, "p_two_sided": None,
                "ratio": None, "ratio_ci95": None, "adds_error": None, "alpha": alpha,
                "statement": "not tested: a run produced non-finite errors"}
    if paired is None:
        paired = a.shape == b.shape
    elif paired and a.shape != b.shape:
        raise ValueError(f"paired: matched positions need equal shapes, got {a.shape} and {b.shape}")
    a2, b2 = _row_blocks(a, block), _row_blocks(b, block)
    level = 1
    while max(_lag1(_coarsen(a2, level)), _lag1(_coarsen(b2, level))) > max_autocorr:
        if min(a2.shape[1], b2.shape[1]) // (2 * level) < 4:
            break
        level *= 2
    ca, cb = _coarsen(a2, level), _coarsen(b2, level)
    rho = max(_lag1(ca), _lag1(cb))
    if paired:
        d = (cb - ca).ravel()
        d = d[np.isfinite(d)]
        ma = mb = d
    else:
        ma, mb = ca.ravel()[np.isfinite(ca.ravel())], cb.ravel()[np.isfinite(cb.ravel())]
    if min(ma.size, mb.size) < 4:
        return {"test": None, "paired": paired, "n_blocks": int(ma.size + mb.size), "p_value": None,
                "p_two_sided": None, "ratio": None, "ratio_ci95": None, "adds_error": None, "alpha": alpha,
                "statement": "not tested: fewer than 4 blocks with finite errors"}
    if paired:
        if np.all(d == 0):
            p1 = p2 = 1.0
        else:
            p1 = float(stats.wilcoxon(d, alternative="greater").pvalue)
            p2 = float(stats.wilcoxon(d, alternative="two-sided").pvalue)
        test = "wilcoxon-signed-rank"
        mean, se, dof = d.mean(), (d.std(ddof=1) / math.sqrt(d.size) if d.size > 1 else 0.0), d.size - 1
    else:
        p1 = float(stats.mannwhitneyu(mb, ma, alternative="greater").pvalue)
        p2 = float(stats.mannwhitneyu(mb, ma, alternative="two-sided").pvalue)
        test = "mann-whitney-u"
        mean = mb.mean() - ma.mean()
        se = math.sqrt(ma.var(ddof=1) / ma.size + mb.var(ddof=1) / mb.size)
        dof = ma.size + mb.size - 2
    half = float(stats.t.ppf(0.975, max(dof, 1)) * se)
    ratio = float(math.exp(mean))
    ci = [float(math.exp(mean - half)), float(math.exp(mean + half))]
    # The interval at the test's own level: its lower end is the one-sided (1 - alpha) bound, so
    # the decision and the interval printed beside it say the same thing.
    level_pct = 100 * (1 - 2 * alpha)
    half_t = float(stats.t.ppf(1 - alpha, max(dof, 1)) * se)
    ci_t = [float(math.exp(mean - half_t)), float(math.exp(mean + half_t))]
    by_test, by_interval = p1 < alpha, ci_t[0] > 1.0
    adds = by_test and by_interval
    where = (f"ratio {ratio:.3g} ({level_pct:g}% CI {ci_t[0]:.3g}-{ci_t[1]:.3g}), one-sided {test} "
             f"p = {p1:.2g} {'<' if by_test else '>='} {alpha:g}")
    if adds:
        statement = f"speculation adds error: speculative/standard error {where}"
    elif by_test or by_interval:
        statement = (f"inconclusive: the rank test and the interval disagree at alpha = {alpha:g}: {where}")
    else:
        statement = f"no evidence that speculation adds error: {where}"
    return {"test": test, "paired": paired, "n_blocks": int(d.size if paired else ma.size + mb.size),
            "block": block, "block_level": level, "lag1_autocorr": rho, "p_value": p1, "p_two_sided": p2,
            "ratio": ratio, "ratio_ci95": ci, "ratio_ci_test": ci_t, "ci_test_level": level_pct,
            "adds_error": bool(adds), "inconclusive": bool(by_test != by_interval), "alpha": alpha,
            "statement": statement}


# ---- effective precision -------------------------------------------------------------------------------

def effective_precision(err: float, declared_u: float, literal_err: float | None = None,
                        factor: float = 2.0) -> dict:
    """The unit roundoff a measured error corresponds to.

    Uncalibrated (``literal_err`` None, basis ``direct``): the error itself, read as a unit
    roundoff (``u_eff = err``), judged against the declared format (an error accumulated over a
    long run is several u of a correct kernel too: only the literal model at the same mode says
    how many, so a ``direct`` flag says "below the declared format", not "worse than the
    literal model").  Calibrated (basis ``literal``) by the literal model's error at the same
    mode and scenario: error scales linearly with the unit roundoff to first order, so
    ``u_eff = declared_u * err / literal_err``.  ``worse`` flags ``u_eff > factor * declared_u``
    (more than ``log2(factor)`` bits below the declared format) on every basis; a non-finite
    error is always worse.  Bits are ``-log2(u)``.
    """
    if not declared_u > 0:
        raise ValueError(f"declared_u: expected a positive unit roundoff, got {declared_u!r}")
    if not factor >= 1:
        raise ValueError(f"factor: expected >= 1, got {factor!r}")
    if literal_err is not None and not literal_err >= 0:
        raise ValueError(f"literal_err: expected an error >= 0, got {literal_err!r}")
    if not math.isfinite(err):
        u_eff, basis = math.inf, "nonfinite"
    elif literal_err is not None and literal_err > 0:
        u_eff, basis = declared_u * err / literal_err, "literal"
    else:
        u_eff, basis = err, "direct"
    bits = -math.log2(u_eff) if 0 < u_eff < math.inf else (math.inf if u_eff == 0 else -math.inf)
    return {"u_eff": _num(u_eff) if u_eff != math.inf else None, "bits_eff": _num(bits),
            "u_declared": declared_u, "bits_declared": -math.log2(declared_u), "basis": basis,
            "factor": factor, "worse": bool(u_eff > factor * declared_u)}


__all__ = ["BinnedCurve", "CRITERIA", "GrowthFit", "LAWS", "LawFit", "OUTCOMES", "bin_edges",
           "compare_speculative", "effective_precision", "fit_growth", "injected_per_flush", "log_bins",
           "predict_at", "tokens_to_budget"]
