"""Calibration of the verdicts: the false-alarm rate of each check on correct kernels, and its resolving power.

Oracle: a correct implementation must pass every check (any failure is a false alarm), and a
kernel with one known precision loss must fail some check (else the loss is unresolved).

* :func:`calibrate` runs the **population** of a family -- its literal models and every correct
  variant registered beside them (``literal-*`` kernels that are not mutants: operation orders,
  fused and unfused folds, staged and immediate folds, bookkeeping policies, ieee dots under tf32,
  reciprocal and division norms, fp32 / fp64 decay weights, records in the compute format;
  ``replayssm/ops/variant_math.py``) -- over scenarios drawn from every input distribution
  (``scenarios/inputs.py``), schedule and precision mode of :data:`MODES`, ``tiny`` geometry,
  random initial state; per check it counts the runs that judged it, the false alarms, the worst
  error / bound ratio and the one-sided 95 % Clopper-Pearson upper bound on the false-alarm rate
  (``1 - 0.05^(1/n)``, about 3/n, for 0 of n).
* :func:`resolving_power` runs each known loss of :data:`LOSSES` (the registered precision
  mutants, and a fold accumulated in bf16 built here) at every mode of :data:`RESOLVING_MODES`
  the loss applies to, over every input distribution on the exhaustive speculative schedule and
  standard decode; per check it reports the scenarios it caught the loss in, the fewest steps to
  its first failure and the error / bound ratio there (and the checks that saw it only within the
  marginal band, no catch).  A loss no check fails is ``unresolved``.  :func:`resolving_cases`,
  :func:`resolving_scenarios` and :func:`catches` are its case list, scenarios and rule of a catch
  (tests/jobs/test_resolving_power.py re-runs every case the ledger's records claim with them).

Expected: 0 false alarms (the target: 0 in 10^4 scenarios per family); the measured tables are
docs/calibration.md, regenerated from the ledger's records by :func:`render_tables`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable

import torch

from replayssm.families import family_names
from replayssm.ops.variant_math import with_mixin
from replayssm.precision import FORMATS, FP4_E2M1, lower_format, parse_mode
from replayssm.registry import get, kernels
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.mutants.registry import MUTANTS
from replayssm.validators.engine.resolved import resolve
from replayssm.validators.engine.runner import run_scenario

# The precision modes the population is drawn over (every state format, stochastic rounding, tf32 dots).
MODES = ("s32a32", "s32a16", "s32afp16", "s16a16", "s16a16-sr", "sfp16a16", "sfp16a16-sr", "sfp8a16", "sfp8a16-sr",
         "si8a16", "s32a32-tf32", "s32a16-tf32", "s16a16-tf32", "s32a16-tf32x3")
# (decode, schedule): every schedule that needs no parameters.
SCHEDULES = tuple(("speculative", s) for s in ("exhaustive", "random", "per-row", "always-1", "always-T", "slot-reuse",
                                               "zero-accept", "ragged", "mixed", "long")) + tuple(
    ("standard", s) for s in ("random", "per-row", "slot-reuse", "ragged"))
# A check's worst error / bound ratio on a passing run: the result summary's key.
RATIO_KEYS = {"output": "worst bound_ratio", "state": "worst state_bound_ratio",
              "flush-checkpoint": "worst checkpoint_bound_ratio", "flush-increment": "worst flush_increment_ratio"}
ALPHA = 0.05


def upper_bound(failures: int, runs: int, alpha: float = ALPHA) -> float:
    """The one-sided ``1 - alpha`` Clopper-Pearson upper confidence bound on a rate seen ``failures``
    times in ``runs`` (``1 - alpha^(1/n)`` for none; 1 for none run)."""
    if runs <= 0:
        return 1.0
    if failures >= runs:
        return 1.0
    if failures == 0:
        return 1.0 - alpha ** (1.0 / runs)

    def cdf(p: float) -> float:  # P(X <= failures) for X ~ Binomial(runs, p)
        lp, lq = math.log(p), math.log1p(-p)
        return sum(math.exp(math.lgamma(runs + 1) - math.lgamma(k + 1) - math.lgamma(runs - k + 1) + k * lp
                            + (runs - k) * lq) for k in range(failures + 1))

    lo, hi = failures / runs, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cdf(mid) > alpha else (lo, mid)
    return hi


def population(family: str) -> tuple[str, ...]:
    """The correct kernels of ``family`` the project keeps: its literal models and their variants."""
    return tuple(n for (f, n), cls in kernels(family).items()
                 if n.startswith("literal-") and getattr(cls, "kind", "") != "mutant")


def _check_args(families, n: int, steps: int, modes) -> tuple[list[str], tuple[str, ...]]:
    known = family_names()
    fams = list(known if families is None else families)
    bad = [f for f in fams if f not in known]
    if not fams or bad:
        raise ValueError(f"families: expected some of {sorted(known)}, got {fams!r}")
    for name, v in (("n", n), ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    modes = tuple(MODES if modes is None else modes)
    for m in modes:
        try:
            parse_mode(m)
        except ValueError as e:
            raise ValueError(f"modes: {m!r} is not a precision mode ({e})") from None
    if not modes:
        raise ValueError("modes: expected at least one precision mode")
    return fams, modes


def draw(family: str, kernel: type, i: int, seed: int, steps: int, modes) -> Scenario | None:
    """Scenario ``i`` of ``family`` for ``kernel`` (a seeded uniform draw of distribution, schedule
    and mode; a mode or decode the kernel refuses is drawn again, None after 20 refusals)."""
    rng = random.Random(f"{seed}/{family}/{i}")
    for _ in range(20):
        dist = rng.choice(sorted(DISTRIBUTIONS))
        decode, schedule = rng.choice(SCHEDULES)
        mode = rng.choice(modes)
        sc = Scenario.tiny(family, decode, mode=mode, distribution=dist, schedule=schedule, steps=steps,
                           seed=rng.randrange(2**31), initial_state="random")
        if kernel.unsupported_reason(resolve(sc).mode, sc.decode_config, {}) is None:
            return sc
    return None


def decode_of(decode: str):
    """The ``DecodeConfig`` a ``tiny`` scenario of that decode uses (what ``unsupported_reason`` is asked)."""
    return Scenario.tiny("mamba2", decode).decode_config


def _checks_run(res) -> list[str]:
    return [c.split(" (")[0] for c in res.checks]


def _ratios(res) -> dict[str, float]:
    """Per check: the worst error / bound of the run (its summary, and its recorded failures)."""
    out = {c: res.summary[k] for c, k in RATIO_KEYS.items() if k in res.summary}
    for f in res.failures:
        if f.value is not None and f.bound:
            out[f.check] = max(out.get(f.check, 0.0), f.value / f.bound)
    return out


@dataclasses.dataclass
class CheckTally:
    """One check's counts over a family's population runs."""

    runs: int = 0
    false_alarms: int = 0
    worst_ratio: float | None = None
    first: str | None = None  # the first false alarm: kernel, scenario and the failure

    def as_dict(self) -> dict:
        return {"runs": self.runs, "false_alarms": self.false_alarms, "worst_ratio": self.worst_ratio,
                "rate": self.false_alarms / self.runs if self.runs else None,
                "upper_95": upper_bound(self.false_alarms, self.runs), "first_false_alarm": self.first}


def calibrate(families=None, n: int = 100, steps: int = 12, seed: int = 0, modes=None, device: str = "cpu",
              kernels_: dict[str, tuple[str, ...]] | None = None,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run ``n`` scenarios per family, kernel ``i % len(population)`` of the population on scenario ``i``
    (``kernels_``: family -> kernel names instead of :func:`population`).  Returns per family the
    scenarios run, the scenarios with a false alarm, and per check a :class:`CheckTally` dict."""
    fams, modes = _check_args(families, n, steps, modes)
    if kernels_ is not None and not isinstance(kernels_, dict):
        raise ValueError(f"kernels_: expected a dict family -> kernel names, got {type(kernels_).__name__}")
    out = {"settings": {"n": n, "steps": steps, "seed": seed, "modes": list(modes), "geometry": "tiny",
                        "distributions": sorted(DISTRIBUTIONS), "schedules": [f"{d}/{s}" for d, s in SCHEDULES],
                        "device": device}, "families": {}}
    for fam in fams:
        names = tuple(kernels_.get(fam, ())) if kernels_ is not None else population(fam)
        if not names:
            raise ValueError(f"kernels_: no kernel given for family {fam!r}")
        classes = {k: get(k, fam) for k in names}
        tally: dict[str, CheckTally] = {}
        per_kernel = {k: {"runs": 0, "false_alarms": 0} for k in names}
        bad_runs, skipped, t0 = 0, 0, time.perf_counter()
        for i in range(n):
            name = names[i % len(names)]
            sc = draw(fam, classes[name], i, seed, steps, modes)
            if sc is None:
                skipped += 1
                continue
            res = run_scenario(sc, name, device=device, repeat_check=False)
            counts = dict(res.failure_counts)
            if res.exception and not counts:
                counts["exception"] = 1
            ratios = _ratios(res)
            for c in {*_checks_run(res), *counts}:
                t = tally.setdefault(c, CheckTally())
                t.runs += 1
                if c in ratios:
                    t.worst_ratio = max(t.worst_ratio or 0.0, ratios[c])
                if counts.get(c):
                    t.false_alarms += 1
                    if t.first is None:
                        f = res.first_failure
                        t.first = (f"{name} at {sc.mode}, {sc.decode}/{sc.schedule}, {sc.distribution}, seed "
                                   f"{sc.seed}: " + (f.describe() if f is not None else str(res.exception)))
            per_kernel[name]["runs"] += 1
            if counts:
                bad_runs += 1
                per_kernel[name]["false_alarms"] += 1
        ran = n - skipped
        out["families"][fam] = {
            "population": list(names), "scenarios": ran, "skipped": skipped, "false_alarm_scenarios": bad_runs,
            "upper_95": upper_bound(bad_runs, ran), "wall_s": time.perf_counter() - t0, "per_kernel": per_kernel,
            "checks": {c: t.as_dict() for c, t in sorted(tally.items())}}
        if progress is not None:
            progress(f"calibrate: {fam}: {ran} scenarios, {bad_runs} with a false alarm "
                     f"(95 % upper bound {upper_bound(bad_runs, ran):.2e}), {time.perf_counter() - t0:.0f} s")
    return out


# ---- resolving power ------------------------------------------------------------------------------------------


class Bf16Accumulation:
    """The flush's fold accumulated in bf16: the records folded one at a time into a running state
    rounded to bf16 after each (an fp32 accumulator held in bf16), stored in the declared format."""

    def fold(self, s0, hist, params, mode):
        n = next(iter(hist.values())).shape[0]
        s = s0
        for j in range(n):
            s = super().fold(s, {k: v[j:j + 1] for k, v in hist.items()}, params, mode)
            s = s.to(torch.bfloat16).to(s0.dtype)
        return s


def _accumulate_bf16(family: str) -> type:
    base = get("literal-replay", family)
    return type(f"Bf16Accumulation{base.__name__}", (base,),
                {"name": "loss-fold-accumulate-bf16", "family": family, "kind": "mutant",
                 "description": "fold accumulated in bf16 (an fp32 accumulation done in bf16)",
                 "math": with_mixin(base.math, Bf16Accumulation), "__module__": __name__,
                 "unsupported_reason": classmethod(lambda cls, mode, decode, options: None if mode.state == "fp32"
                                                   else "an fp32 accumulation: fp32 state modes only")})


FP4_E2M1_U = 2.0**-2  # one mantissa bit; fp4 e2m1 is a rounding target only, no row of FORMATS


def _u(name: str) -> float:
    return FP4_E2M1_U if name == FP4_E2M1 else FORMATS[name].unit_roundoff


@dataclasses.dataclass(frozen=True)
class Loss:
    """A known precision loss: the kernel that has it (a registered mutant, or a factory of a class
    per family) and the unit roundoff of the precision the loss degrades to at a mode."""

    name: str
    what: str
    kernel: str | Callable[[str], type]
    lost_u: Callable[[object], float | None]


LOSSES = (
    Loss("fold-weights-bf16", "fold with each weighted input rounded to bf16 (under a declared fp32 / tf32 fold)",
         "mutant-fold-weighted-input-bf16", lambda m: _u("bf16")),
    Loss("fold-accumulate-bf16", "fp32 accumulation of the fold done in bf16", _accumulate_bf16,
         lambda m: _u("bf16")),
    Loss("flush-bf16-arithmetic", "fp32 checkpoint folded at bf16-level accuracy (off the bf16 grid)",
         "mutant-flush-bf16-arithmetic", lambda m: 0.75 * _u("bf16")),
    Loss("checkpoint-one-lower", "declared fp32 checkpoint stored at bf16 precision",
         "mutant-checkpoint-bf16-precision", lambda m: _u("bf16")),
    Loss("state-one-lower", "state stored one format lower than declared (precision.lower_format)",
         "mutant-low-precision-state", lambda m: _u(lower_format(m.state)) if lower_format(m.state) else None),
    Loss("decay-records-bf16", "decay records (Δ, g) stored in bf16 instead of fp32", "mutant-decay-records-bf16",
         lambda m: _u("bf16")),
)
# Every state format below fp64, each dot where fp32 arithmetic declares one.
RESOLVING_MODES = ("s32a32", "s32a32-tf32", "s32a16", "s32a16-tf32", "s16a16", "s16a16-tf32", "sfp16a16", "sfp8a16",
                   "si8a16")
RESOLVING_SCHEDULES = (("speculative", "exhaustive"), ("standard", "random"))


def loss_class(loss: Loss, fam: str) -> type | None:
    """The kernel class with ``loss`` in family ``fam`` (None: the family lacks the loss's mechanism)."""
    if callable(loss.kernel):
        return loss.kernel(fam)
    if loss.kernel in MUTANTS:
        return MUTANTS[loss.kernel].classes.get(fam)
    return kernels(fam).get((fam, loss.kernel))


def raising_is_its_bug(loss: Loss) -> bool:
    """Whether a run of ``loss``'s kernel that ends in an exception is a catch (the mutant declares it)."""
    return not callable(loss.kernel) and loss.kernel in MUTANTS and MUTANTS[loss.kernel].raises


def _losses(losses) -> list[Loss]:
    by_name = {x.name: x for x in LOSSES}
    if losses is None:
        return list(LOSSES)
    chosen = [x if isinstance(x, Loss) else by_name.get(x) for x in losses]
    if not chosen or any(x is None for x in chosen):
        raise ValueError(f"losses: expected some of {sorted(by_name)} (or Loss objects), got {list(losses)!r}")
    return chosen


def resolving_cases(families=None, modes=None, losses=None) -> list[tuple[str, Loss, type, str]]:
    """The cases :func:`resolving_power` runs, in its order: ``(family, loss, kernel class, mode)`` for
    every family, loss of ``losses`` (default :data:`LOSSES`) the family has the mechanism of, and mode
    of ``modes`` (default :data:`RESOLVING_MODES`) the loss applies to and the kernel runs."""
    fams, modes = _check_args(families, 1, 1, RESOLVING_MODES if modes is None else modes)
    out = []
    for fam in fams:
        for loss in _losses(losses):
            cls = loss_class(loss, fam)
            if cls is None:
                continue  # the family lacks the loss's mechanism (the mutant's needs)
            for mode in modes:
                pm = parse_mode(mode)
                if loss.lost_u(pm) is None or cls.unsupported_reason(pm, decode_of("speculative"), {}) is not None:
                    continue
                out.append((fam, loss, cls, mode))
    return out


def resolving_scenarios(fam: str, cls: type, mode: str, steps: int, seed: int) -> list[Scenario]:
    """The scenarios of one case, in the order it runs them: every input distribution x
    :data:`RESOLVING_SCHEDULES` whose decode ``cls`` runs, ``tiny``, random initial state."""
    pm = parse_mode(mode)
    return [Scenario.tiny(fam, decode, mode=mode, distribution=dist, schedule=schedule, steps=steps, seed=seed,
                          initial_state="random")
            for dist in sorted(DISTRIBUTIONS) for decode, schedule in RESOLVING_SCHEDULES
            if cls.unsupported_reason(pm, decode_of(decode), {}) is None]


def catches(res, raises_ok: bool) -> dict[str, int]:
    """The checks a run of a loss kernel caught it by, with their failure counts (an exception only
    where raising is the kernel's bug); a marginal (within the band, ``res.marginals``) is no catch."""
    return {c: k for c, k in res.failure_counts.items() if c != "exception" or raises_ok}


def resolving_power(families=None, steps: int = 12, seed: int = 0, modes=None, losses=None, device: str = "cpu",
                    progress: Callable[[str], None] | None = None) -> dict:
    """For each case of :func:`resolving_cases` (family, loss of :data:`LOSSES` -- ``losses``: names, or
    :class:`Loss` objects -- and mode of ``modes``, default :data:`RESOLVING_MODES`, the loss applies to):
    the :func:`resolving_scenarios`, ``steps`` steps each; per check the scenarios that caught it, the
    fewest steps to its first failure and the error / bound ratio there (``marginal``: the same for the
    checks that saw it only within the marginal band, no catch).  ``verdict``: ``resolved`` or
    ``unresolved`` (no check failed; a run that only raised is no catch unless raising is the mutant's bug)."""
    fams, modes = _check_args(families, 1, steps, RESOLVING_MODES if modes is None else modes)
    cases = resolving_cases(fams, modes, losses)
    out = {"settings": {"steps": steps, "seed": seed, "modes": list(modes), "geometry": "tiny",
                        "distributions": sorted(DISTRIBUTIONS),
                        "schedules": [f"{d}/{s}" for d, s in RESOLVING_SCHEDULES], "device": device}, "cases": []}
    for fam, loss, cls, mode in cases:
        out["cases"].append(_resolve(fam, loss, cls, mode, steps, seed, device))
        if progress is not None:
            c = out["cases"][-1]
            progress(f"resolving: {fam} {loss.name} {mode}: {c['verdict']} "
                     f"({', '.join(c['caught_by']) or 'no check'})")
    return out


def _tally(per: dict, check: str, failures) -> None:
    first = min((f for f in failures if f.check == check), key=lambda f: f.sort_key, default=None)
    p = per.setdefault(check, {"scenarios": 0, "steps": None, "ratio": None})
    p["scenarios"] += 1
    if first is not None and (p["steps"] is None or first.step + 1 < p["steps"]):
        p["steps"] = first.step + 1
        p["ratio"] = first.value / first.bound if first.value is not None and first.bound else None


def _resolve(fam, loss, cls, mode, steps, seed, device) -> dict:
    pm = parse_mode(mode)
    raises_ok = raising_is_its_bug(loss)
    per: dict[str, dict] = {}
    marginal: dict[str, dict] = {}
    scenarios, caught, raised = 0, 0, 0
    for sc in resolving_scenarios(fam, cls, mode, steps, seed):
        res = run_scenario(sc, cls, device=device, repeat_check=False)
        scenarios += 1
        counts = catches(res, raises_ok)
        raised += bool(res.exception)
        caught += bool(counts)
        for c in counts:
            _tally(per, c, res.failures)
        for c in res.marginal_counts:
            if c not in counts:
                _tally(marginal, c, res.marginals)
    return {"family": fam, "loss": loss.name, "what": loss.what, "kernel": cls.name, "mode": mode,
            "lost_u": loss.lost_u(pm), "declared_u": pm.state_unit_roundoff, "scenarios": scenarios,
            "scenarios_caught": caught, "raised": raised, "checks": dict(sorted(per.items())),
            "caught_by": sorted(per), "marginal": {c: p for c, p in sorted(marginal.items()) if c not in per},
            "verdict": "resolved" if per else "unresolved"}


# ---- the tables of docs/calibration.md, from records ------------------------------------------------------------

BEGIN, END = "<!-- calibration-tables:begin -->", "<!-- calibration-tables:end -->"


def is_selection(r: dict) -> bool:
    """A calibration record of a ``--kernels`` selection (no literal model in it, e.g. the Triton kernels on a
    GPU), not of a family's population: the population tables leave it out (``tools/ledger_tables.py``
    ``calibration-kernels`` shows it)."""
    pop = (r.get("config") or {}).get("population")
    return pop is not None and not any(n.startswith("literal-") for n in pop)


def latest_records(records) -> dict[str, dict]:
    """The newest record of each case of the calibration job's population runs and resolving cases (the
    ledger's order breaks ties)."""
    out: dict[str, dict] = {}
    for r in records:
        if r.get("job") != "calibration" or is_selection(r):
            continue
        if r["case"] not in out or r["created"] >= out[r["case"]]["created"]:
            out[r["case"]] = r
    return out


def _num(v, fmt: str = ".3g") -> str:
    return "—" if v is None or isinstance(v, str) else format(v, fmt)


def _rec(r: dict, ledger: str) -> str:
    return f"[rec:{r['id']}]({ledger})"


def render_tables(records, ledger: str = "reports/ledger.jsonl") -> str:
    """The false-alarm and resolving-power tables (Markdown) of the newest calibration records among
    ``records``, each row citing its record (``ledger``: the link target)."""
    latest = latest_records(records)
    fams = sorted({r["family"] for r in latest.values() if r["family"]})
    lines = ["### False alarms per family", "",
             "| family | correct kernels | scenarios | with a false alarm | 95 % upper bound on the rate | record |",
             "|---|---|---|---|---|---|"]
    for f in fams:
        r = latest.get(f"calibration/{f}")
        if r is not None:
            m = r["metrics"]
            lines.append(f"| {f} | {m['kernels']} | {m['scenarios']} | {m['false_alarm_scenarios']} | "
                         f"{_num(m['upper_95'])} | {_rec(r, ledger)} |")
    lines += ["", "### False alarms per check", "",
              "| family | check | runs | false alarms | 95 % upper bound | worst error / bound | record |",
              "|---|---|---|---|---|---|---|"]
    for case, r in sorted(latest.items()):
        parts = case.split("/")
        if parts[0] == "calibration" and len(parts) == 3:
            m = r["metrics"]
            lines.append(f"| {parts[1]} | `{parts[2]}` | {m['runs']} | {m['false_alarms']} | {_num(m['upper_95'])} | "
                         f"{_num(m['worst_ratio'])} | {_rec(r, ledger)} |")
    res = [r for case, r in sorted(latest.items()) if case.startswith("resolving/")]
    lines += ["", "### Resolving power: which check catches each loss", "",
              "Per check: the fewest steps to its first failure, the error / bound ratio there (— for an exact "
              "check), the scenarios it failed; marginal only: the checks that saw the loss within the marginal "
              "band and never failed it (no catch).", "",
              "| family | loss | mode | verdict | caught by | scenarios caught | record |",
              "|---|---|---|---|---|---|---|"]
    for r in res:
        m = r["metrics"]
        by = "; ".join(f"`{c}`: {m.get('steps_' + c.replace('-', '_'))} steps, ratio "
                       f"{_num(m.get('ratio_' + c.replace('-', '_')))}, {m.get('scenarios_' + c.replace('-', '_'))} "
                       f"scenarios" for c in m["caught_by"]) or "no check failed"
        near = ", ".join(f"`{c}` ({m.get('marginal_scenarios_' + c.replace('-', '_'))} scenarios, ratio "
                         f"{_num(m.get('marginal_ratio_' + c.replace('-', '_')))})" for c in m.get("marginal_by", []))
        by += f"; marginal only: {near}" if near else ""
        lines.append(f"| {r['family']} | {r['config']['loss']} | {r['mode']} | "
                     f"{'resolved' if m['resolved'] else '**unresolved**'} | {by} | "
                     f"{m['scenarios_caught']}/{m['scenarios']} | {_rec(r, ledger)} |")
    lines += ["", "### Resolving power: the smallest loss each check detects", "",
              "Per family, check and mode: the caught loss of the smallest unit roundoff lost to (its u / the declared "
              "state's u); — where the check catches none of the losses run at that mode.", ""]
    for f in fams:
        mine = [r for r in res if r["family"] == f]
        modes = [m for m in RESOLVING_MODES if any(r["mode"] == m for r in mine)]
        checks = sorted({c for r in mine for c in r["metrics"]["caught_by"]})
        if not mine:
            continue
        lines += [f"{f}:", "", "| check | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
        for c in checks:
            cells = []
            for mo in modes:
                hit = [r for r in mine if r["mode"] == mo and c in r["metrics"]["caught_by"]]
                best = min(hit, key=lambda r: r["metrics"]["lost_u"], default=None)
                ratio = None if best is None else best["metrics"]["lost_u"] / best["metrics"]["declared_u"]
                cells.append("—" if best is None else f"{best['config']['loss']} ({ratio:.2g})")
            lines.append(f"| `{c}` | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def update_doc(text: str, records, ledger: str = "reports/ledger.jsonl") -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by :func:`render_tables`."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"doc: expected the markers {BEGIN} and {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{render_tables(records, ledger)}{END}{tail}"


__all__ = ["BEGIN", "END", "LOSSES", "MODES", "RESOLVING_MODES", "RESOLVING_SCHEDULES", "SCHEDULES", "Bf16Accumulation",
           "CheckTally", "Loss", "calibrate", "catches", "draw", "latest_records", "loss_class", "population",
           "raising_is_its_bug", "render_tables", "resolving_cases", "resolving_power", "resolving_scenarios",
           "update_doc", "upper_bound"]
