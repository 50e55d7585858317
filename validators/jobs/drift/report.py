"""Drift reports: analyse the cells of a sweep and write JSON, Markdown and a self-contained HTML page.

Oracle: the report is a pure function of (sweep config, cell results, settings, budgets): no
clock, no host name, no path outside what the caller passes, so a resumed run and a merged
sharded run write byte-identical files.  The JSON schema is documented (and versioned) in
docs/drift_report_schema.md; every analysis number comes from
:mod:`replayssm.validators.jobs.drift.analysis` (fits, crossings, tests, effective precision) and
:mod:`replayssm.validators.jobs.drift.budgets` (the --check verdicts).
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from replayssm.precision import parse_mode
from replayssm.validators.engine.tolerances import state_unit
from replayssm.validators.jobs.drift.analysis import (
    BinnedCurve,
    compare_speculative,
    effective_precision,
    fit_growth,
    injected_per_flush,
    predict_at,
    tokens_to_budget,
)
from replayssm.validators.jobs.drift.budgets import Budgets, check_cell
from replayssm.validators.jobs.drift.svg_plot import PALETTE, Plot, Series, render
from replayssm.validators.jobs.drift.sweep import atomic_write, stop_reason
from replayssm.validators.jobs.drift.verdict import RULE, judge

SCHEMA = "replayssm-drift-report"
SCHEMA_VERSION = 1
SCHEDULE_ORDER = ("standard", "spec-random", "spec-always-1", "spec-always-T")
SCHEDULE_LABEL = {"standard": "standard (L={L})", "spec-random": "spec, random k (T'={T})",
                  "spec-always-1": "spec, k = 1", "spec-always-T": "spec, k = T'"}


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "never" if x > 0 else "-inf"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def _tokens(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if math.isinf(x):
        return "never"
    if x == 0:
        return "from the start"
    if x >= 1e4:
        return f"{x:.3g}"
    return f"{int(round(x)):,}"


# ---- analysis ------------------------------------------------------------------------------------------

def _curve_block(curve: BinnedCurve, criterion: str, budget: float, horizon: float, u: float,
                 literal_rms: float | None, factor: float) -> dict:
    tb, rms, cnt = curve.binned()
    block = {"curve": {"t": [float(x) for x in tb], "rms": [float(x) for x in rms], "count": [int(c) for c in cnt]},
             "samples": curve.samples, "peak": _num(curve.peak_rms()), "rms": _num(curve.rms()),
             "nonfinite": curve.nonfinite, "first_nonfinite": curve.first_nonfinite}
    try:
        fit = fit_growth(curve, criterion=criterion)
    except ValueError as e:
        block.update(fit={"law": "insufficient", "reason": str(e)}, fit_curve=None, budget_crossing=None,
                     at_horizon=None)
        fit = None
    if fit is not None:
        fd = fit.to_dict()
        block["fit"] = fd
        ts = np.unique(np.geomspace(1.0, max(horizon, curve.t_seen, 2.0), 64))
        pred = fit.predict(ts) if fit.law not in ("nonfinite",) else np.full_like(ts, np.nan)
        block["fit_curve"] = {"t": [float(x) for x in ts], "e": [_num(x) for x in pred]}
        cross = tokens_to_budget(fit, budget, curve)
        block["budget_crossing"] = {k: (None if isinstance(v, float) and math.isinf(v) and k != "predicted" else v)
                                    for k, v in cross.items()}
        if isinstance(cross["predicted"], float) and math.isinf(cross["predicted"]):
            block["budget_crossing"]["predicted"] = "never"
        observed_to_h = [float(r) for t, r in zip(tb, rms) if t <= horizon]
        at_h = predict_at(fit, horizon)
        worst = max([at_h] + observed_to_h) if math.isfinite(at_h) else math.inf
        block["at_horizon"] = {"horizon": horizon, "fitted": _num(at_h), "worst": _num(worst),
                               "extrapolated": horizon > curve.t_seen}
    ep = effective_precision(curve.rms() if curve.nonfinite == 0 and curve.samples else math.inf, u,
                             literal_rms, factor)
    block["effective_precision"] = ep
    return block


def _traffic(cell: dict, mode) -> dict:
    """State memory traffic per token per sequence and layer (standard-decode bytes model,
    docs/recurrences.md section 2)."""
    S = cell["state_elements"]
    row = cell["geometry"].get("dstate") or cell["geometry"].get("head_k_dim")
    b = mode.state_bytes_per_element(row)
    if cell["kernel_kind"] == "baseline":
        per_tok, model = 2 * S * b, "baseline: state read + written every token"
        fp32 = 2 * S * 4.0
    else:
        L = cell["decode"]["buffer"] if cell["decode"]["decode"] == "standard" else 16
        per_tok, model = S * b * (1 + 1 / L), f"replay: checkpoint read every token + written every L = {L}"
        fp32 = S * 4.0 * (1 + 1 / L)
    return {"state_bytes_per_token": per_tok, "fp32_state_bytes_per_token": fp32,
            "saved_bytes_per_token": fp32 - per_tok, "saved_fraction": (fp32 - per_tok) / fp32, "model": model}


LITERAL_OF_KIND = {"replay": "literal-replay", "baseline": "literal-baseline"}


def analyse(cfg, cells: list[dict], *, skipped: list[dict] | None = None, budget: float = 1e-2,
            horizon: float | None = None, budgets: Budgets | None = None, criterion: str = "aic",
            alpha: float = 0.01, precision_factor: float = 2.0, environment: dict | None = None) -> dict:
    """The report dictionary (schema in docs/drift_report_schema.md) of ``cells`` (cell results of
    sweep ``cfg``, in the sweep's order)."""
    if not budget > 0:
        raise ValueError(f"budget: expected a positive error level, got {budget!r}")
    H = float(horizon) if horizon is not None else float(cfg.tokens)
    if not H >= 1:
        raise ValueError(f"horizon: expected >= 1 token, got {horizon!r}")
    # The calibrating literal model of each cell: the literal model of the cell's own kind (a
    # baseline rounds its state every token, a replay kernel every flush), else literal-replay.
    literal = {}
    for c in cells:
        if c["kernel"] in LITERAL_OF_KIND.values():
            key = (c["kernel"], c["family"], c["mode"], c["distribution"], c["schedule"])
            literal[key] = c
    out_cells = []
    for c in cells:
        mode = parse_mode(c["mode"])
        curves = {k: BinnedCurve.from_dict(v) for k, v in c["curves"].items()}
        where = (c["family"], c["mode"], c["distribution"], c["schedule"])
        own = LITERAL_OF_KIND.get(c.get("kernel_kind"), "literal-replay")
        lit = literal.get((own, *where)) or literal.get(("literal-replay", *where))
        calibrate = lit is not None and lit is not c
        lcur = {k: BinnedCurve.from_dict(v) for k, v in lit["curves"].items()} if calibrate else {}
        # Output bits against the activation format (max with the compute format's); state bits
        # against the declared state format (tolerances.state_unit), not the coarsest of the mode.
        u_out, u_state = max(mode.act_unit_roundoff, mode.compute_unit_roundoff), state_unit(mode)
        out_block = _curve_block(curves["output"], criterion, budget, H, u_out,
                                 lcur["output"].rms() if calibrate else None, precision_factor)
        state_block = _curve_block(curves["state"], criterion, budget, H, u_state,
                                   lcur["state"].rms() if calibrate else None, precision_factor)
        ftb, frms, _ = curves["flush"].binned()
        loc = curves["flush_local"]
        inj = injected_per_flush(ftb, frms, local_rms=loc.rms() if loc.samples and not loc.nonfinite else None)
        lit_loc = lcur["flush_local"].rms() if calibrate and lcur["flush_local"].samples else None
        inj["effective_precision"] = (effective_precision(inj["estimate"], u_state, lit_loc,
                                                          precision_factor)
                                      if inj["estimate"] is not None else None)
        ltb, lrms, lcnt = loc.binned()
        flush = {"curve": {"t": [float(x) for x in ftb], "rms": [float(x) for x in frms]},
                 "local_curve": {"t": [float(x) for x in ltb], "rms": [float(x) for x in lrms],
                                 "count": [int(x) for x in lcnt]},
                 "flushes_per_row": c["flushes"],
                 "tokens_per_flush": c["tokens_accepted"] / max(sum(c["flushes"]), 1),
                 "injected": inj}
        draft = None
        if "draft" in curves:
            dtb, drms, _ = curves["draft"].binned()
            draft = {"curve": {"t": [float(x) for x in dtb], "rms": [float(x) for x in drms]},
                     "peak": _num(curves["draft"].peak_rms()), "rms": _num(curves["draft"].rms()),
                     "nonfinite": curves["draft"].nonfinite}
        cell = {
            "id": c["id"], "family": c["family"], "kernel": c["kernel"], "kernel_kind": c["kernel_kind"],
            "mode": c["mode"], "distribution": c["distribution"], "schedule": c["schedule"], "decode": c["decode"],
            "geometry_name": c["geometry_name"], "geometry": c["geometry"], "rows": c["rows"], "tokens": c["tokens"],
            "tokens_run": c.get("tokens_run", c["tokens"]), "truncated": bool(c.get("truncated", False)),
            "steps": c["steps"], "tokens_accepted": c["tokens_accepted"], "tokens_verified": c["tokens_verified"],
            "declared_u": mode.unit_roundoff,
            "calibrated_by": lit["id"] if calibrate else None,
            "output": out_block, "state": state_block, "draft": draft, "flush": flush,
            "traffic": _traffic(c, mode), "exact_failures": c["failure_counts"], "exception": c["exception"],
            "stopped": (None if stop_reason(c) is None
                        else {"token": int(c.get("tokens_run", 0)), "reason": stop_reason(c)}),
            "check": None,
            "verdict": judge(c, mode),
        }
        if budgets is not None:
            b = budgets.get_budget(c["family"], c["mode"])
            w_out = out_block["fit"].get("weights") if isinstance(out_block.get("fit"), dict) else None
            w_st = state_block["fit"].get("weights") if isinstance(state_block.get("fit"), dict) else None
            chk = check_cell(b, c.get("tokens_run", c["tokens"]), curves["output"].peak_rms(),
                             curves["state"].peak_rms(), w_out, w_st)
            if c["exception"]:
                chk["failures"].append("the kernel raised: " + c["exception"].strip().splitlines()[0])
            for name, n in sorted(c["failure_counts"].items()):
                chk["failures"].append(f"exact check {name!r} failed {n} time(s)")
            chk["pass"] = not chk["failures"]
            chk["budget"] = b.to_dict()
            cell["check"] = chk
        out_cells.append(cell)
    report = {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
        "sweep": {**cfg.to_dict(), "digest": cfg.digest},
        "settings": {"budget": budget, "horizon": H, "criterion": criterion, "alpha": alpha,
                     "precision_factor": precision_factor,
                     "budgets_file": None if budgets is None else budgets.path.name},
        "environment": environment or {},
        "cells": out_cells,
        "skipped": skipped or [],
        "speculation": _speculation(cells, out_cells, alpha),
        "recommendations": _recommendations(out_cells, budget, H),
    }
    report["verdict"] = {"gross_rule": RULE, "failed": [c["id"] for c in out_cells if not c["verdict"]["pass"]],
                         "pass": all(c["verdict"]["pass"] for c in out_cells)}
    checked = [c for c in out_cells if c["check"] is not None]
    report["check"] = {
        "enabled": budgets is not None, "cells": len(checked),
        "failed": [c["id"] for c in checked if not c["check"]["pass"]],
        "pass": all(c["check"]["pass"] for c in checked) if checked else None,
    }
    return report


def _verdict(s: dict) -> str:
    if s.get("adds_error") is None:
        return s["statement"]
    if s.get("inconclusive"):
        return "inconclusive"
    return "adds error" if s["adds_error"] else "no evidence"


def _speculation(raw: list[dict], cells: list[dict], alpha: float) -> list[dict]:
    by = {c["id"]: c for c in cells}
    groups: dict[tuple, dict[str, dict]] = {}
    for c in raw:
        groups.setdefault((c["family"], c["kernel"], c["mode"], c["distribution"]), {})[c["schedule"]] = c
    out = []
    for (fam, ker, mode, dist), g in groups.items():
        std = g.get("standard")
        if std is None:
            continue
        a = _blocks(std)
        for sched in SCHEDULE_ORDER[1:]:
            sp = g.get(sched)
            if sp is None:
                continue
            b = _blocks(sp)
            entry = {"family": fam, "kernel": ker, "mode": mode, "distribution": dist, "schedule": sched,
                     "standard": std["id"], "speculative": sp["id"],
                     "tokens_per_flush": {"standard": by[std["id"]]["flush"]["tokens_per_flush"],
                                          "speculative": by[sp["id"]]["flush"]["tokens_per_flush"]}}
            if std["exception"] or sp["exception"]:
                entry.update(test=None, statement="not tested: a run raised")
            else:
                entry.update(compare_speculative(a, b, block=1, alpha=alpha, paired=False))
            out.append(entry)
    return out


def _blocks(cell: dict) -> np.ndarray:
    """Per-row block geometric means; NaN where a block is empty, inf when the run had
    non-finite output errors (the test then declines)."""
    x = np.array([[np.nan if v is None else v for v in row] for row in cell["blocks"]], dtype=np.float64)
    if cell["curves"]["output"]["nonfinite"]:
        x[:] = np.inf
    return x


def _cost_key(mode_id: str):
    m = parse_mode(mode_id)
    return (m.state_bytes_per_element(128), m.act_bytes_per_element, m.rounding == "stochastic", mode_id)


def _recommendations(cells: list[dict], budget: float, horizon: float) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["family"], c["kernel"], c["distribution"], c["schedule"]), []).append(c)
    out = []
    for (fam, ker, dist, sched), cs in groups.items():
        cs = sorted(cs, key=lambda c: _cost_key(c["mode"]))
        considered, pick = [], None
        for c in cs:
            ah = c["output"].get("at_horizon")
            worst = ah["worst"] if ah else None
            ok = worst is not None and worst <= budget and not c["exception"] and not c["exact_failures"]
            considered.append({"mode": c["mode"], "worst_output_error": worst, "inside": ok})
            if ok and pick is None:
                pick = c
        entry = {"family": fam, "kernel": ker, "distribution": dist, "schedule": sched, "budget": budget,
                 "horizon": horizon, "considered": considered, "mode": None}
        if pick is not None:
            ah = pick["output"]["at_horizon"]
            sh = pick["state"].get("at_horizon")
            entry.update(mode=pick["mode"], output_error=ah["worst"], state_error=sh["worst"] if sh else None,
                         extrapolated=ah["extrapolated"], traffic=pick["traffic"])
        out.append(entry)
    return out


# ---- JSON ------------------------------------------------------------------------------------------------

def to_json(report: dict) -> str:
    return json.dumps(report, indent=1, sort_keys=False, allow_nan=False) + "\n"


# ---- Markdown ------------------------------------------------------------------------------------------

def _law_text(block: dict) -> str:
    fit = block.get("fit") or {}
    law = fit.get("law", "–")
    if law in ("exact", "nonfinite", "insufficient"):
        return law
    p, se = fit.get("params") or {}, fit.get("stderr") or {}
    main = {"sqrt": "a", "linear": "b", "exponential": "lam"}.get(law)
    if law == "bounded":
        sat = fit.get("saturation")
        return f"bounded (plateau {_fmt(sat)})"
    if main and main in p:
        return f"{law} ({main} = {_fmt(p[main])} ± {_fmt(se.get(main), 2)})"
    return law


def _cell_name(c: dict) -> str:
    st = c.get("stopped")
    return c["id"] + (f" (stopped at token {st['token']:,}: {st['reason']})" if st else "")


# The basis of an effective-precision figure, as the tables mark it (the legends say so).
BASIS_MARK = {"literal": "c", "direct": "d", "nonfinite": "d"}


def _bits_text(ep: dict) -> str:
    """Effective bits, ⚠ when worse than declared by more than the factor, and the basis mark."""
    if not ep:
        return "–"
    return f"{_fmt(ep.get('bits_eff'), 3)}{' ⚠' if ep.get('worse') else ''} ({BASIS_MARK[ep['basis']]})"


BITS_LEGEND = ("eff. bits: -log2 of the effective unit roundoff, ⚠ when below the declared format by more than "
               "x{f:g} in unit roundoff ({b:g} bit(s)); basis (c): calibrated by the literal model at the same mode "
               "and scenario (u_declared x error / literal error), (d): the error itself read against the "
               "declared format (no literal model ran beside it: a correct kernel's accumulated error is "
               "several u too)")


def _cells_table_md(cells: list[dict]) -> list[str]:
    rows = ["| cell | output law | output peak | state law | state peak | injected / flush | tokens to budget |"
            " eff. bits out / state | verdict | check |", "|" + "---|" * 10]
    for c in cells:
        inj = c["flush"]["injected"]
        cross = (c["output"].get("budget_crossing") or {}).get("predicted")
        ep_o = c["output"]["effective_precision"]
        ep_s = (inj.get("effective_precision") or {})
        bits = f"{_bits_text(ep_o)} / {_bits_text(ep_s)}"
        chk = "–" if c["check"] is None else ("pass" if c["check"]["pass"] else "**FAIL**")
        vd = "pass" if c["verdict"]["pass"] else "**FAIL**"
        rows.append(f"| {_cell_name(c)} | {_law_text(c['output'])} | {_fmt(c['output']['peak'])} | "
                    f"{_law_text(c['state'])} | {_fmt(c['state']['peak'])} | {_fmt(inj.get('estimate'))} | "
                    f"{_tokens(cross)} | {bits} | {vd} | {chk} |")
    return rows


def to_markdown(report: dict, html_name: str | None = "drift_report.html") -> str:
    sw, st = report["sweep"], report["settings"]
    geo = ", ".join(f"{k}={v}" for k, v in sw["geometry"].items())
    lines = [f"# Drift report ({SCHEMA} v{report['schema_version']})", ""]
    if html_name:
        lines += [f"Plots: [{html_name}]({html_name}).", ""]
    lines += [f"- sweep {sw['digest']}: families {', '.join(sw['families'])}; kernels {', '.join(sw['kernels'])}; "
              f"modes {', '.join(sw['modes'])}; scenarios {', '.join(sw['distributions'])}; "
              f"schedules {', '.join(sw['schedules'])}",
              f"- geometry {geo}; {sw['rows']} rows x {sw['tokens']:,} tokens per cell; standard L = {sw['buffer']}, "
              f"speculative T' = {sw['window']}, B = {sw['history']}; seed {sw['seed']}",
              f"- budget {st['budget']:g} at horizon {st['horizon']:,.0f} tokens; growth laws chosen by "
              f"{st['criterion'].upper()}; speculation test at alpha = {st['alpha']:g}",
              ]
    env = report.get("environment") or {}
    if env:
        lines.append("- environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    vd = report["verdict"]
    lines.append(f"- verdict (no budgets): **{'PASS' if vd['pass'] else 'FAIL'}**"
                 + ("" if vd["pass"] else f" ({len(vd['failed'])} cell(s): {', '.join(vd['failed'][:5])}"
                                          f"{', ...' if len(vd['failed']) > 5 else ''})"))
    chk = report["check"]
    if chk["enabled"]:
        verdict = "PASS" if chk["pass"] else f"FAIL ({len(chk['failed'])} cell(s))"
        lines.append(f"- budget check against {st['budgets_file']}: **{verdict}**")
    lines += ["", "## Cells", "", *_cells_table_md(report["cells"]), ""]
    f = st["precision_factor"]
    lines += ["Peak = the largest log-binned RMS of ||out - ref|| / ||ref||; injected / flush = RMS error one flush "
              f"adds to the checkpoint; {BITS_LEGEND.format(f=f, b=math.log2(f))}; verdict: the default judgement "
              "(non-finite values, an exact check, or an error above the gross bound "
              f"{report['verdict']['gross_rule']} fail; docs/drift_report_schema.md); check: the budgets of --check.",
              ""]
    lines += ["## Does speculation add error?", "", "| family | kernel | mode | scenario | schedule | "
              "tokens/flush std / spec | ratio (CI at the test's level, 1 − 2α) | p | verdict |", "|" + "---|" * 9]
    for s in report["speculation"]:
        ci = s.get("ratio_ci_test") or s.get("ratio_ci95")
        tpf = s["tokens_per_flush"]
        lines.append(f"| {s['family']} | {s['kernel']} | {s['mode']} | {s['distribution']} | {s['schedule']} | "
                     f"{tpf['standard']:.3g} / {tpf['speculative']:.3g} | "
                     f"{_fmt(s.get('ratio'))} ({_fmt(ci[0]) if ci else '–'}–{_fmt(ci[1]) if ci else '–'}) | "
                     f"{_fmt(s.get('p_value'), 2)} | {_verdict(s)} |")
    lines += ["", f"## Recommendations (budget {st['budget']:g}, horizon {st['horizon']:,.0f} tokens)", "",
              "| family | kernel | scenario | schedule | cheapest mode inside | output error at horizon | "
              "state bytes/token | saved vs fp32 state |", "|" + "---|" * 8]
    for r in report["recommendations"]:
        if r["mode"] is None:
            lines.append(f"| {r['family']} | {r['kernel']} | {r['distribution']} | {r['schedule']} | none stays inside "
                         f"| – | – | – |")
            continue
        t = r["traffic"]
        lines.append(f"| {r['family']} | {r['kernel']} | {r['distribution']} | {r['schedule']} | {r['mode']} | "
                     f"{_fmt(r['output_error'])}{' (extrapolated)' if r['extrapolated'] else ''} | "
                     f"{t['state_bytes_per_token']:,.0f} | {t['saved_bytes_per_token']:,.0f} B "
                     f"({100 * t['saved_fraction']:.0f} %) |")
    if chk["enabled"]:
        lines += ["", "## Budget check", ""]
        for c in report["cells"]:
            if c["check"] and (c["check"]["failures"] or c["check"]["warnings"]):
                for f in c["check"]["failures"]:
                    lines.append(f"- FAIL {c['id']}: {f}")
                for w in c["check"]["warnings"]:
                    lines.append(f"- warning {c['id']}: {w}")
        if chk["pass"]:
            lines.append(f"All {chk['cells']} cells inside their budgets.")
    if report["skipped"]:
        lines += ["", "## Not run", ""]
        lines += [f"- {s.get('id', s.get('kernel'))}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


# ---- HTML (the template replayssm/templates/drift_report.html.j2) ----------------------------------------


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"p{self.n}"


def _budget_series(report: dict, fam: str, mode: str, cells: list[dict], tmax: float, what: str) -> list[Series]:
    out = []
    if what == "output":
        out.append(Series(f"your budget {report['settings']['budget']:g}", [1.0, tmax],
                          [report["settings"]["budget"]] * 2, color="#999999", style="hline", width=1.2))
    chk = next((c["check"] for c in cells if c["check"]), None)
    if chk:
        b = chk["budget"]
        ts = list(np.geomspace(1, max(tmax, 2), 40))
        scale = [_scale(b, t) for t in ts]
        out.append(Series(f"tolerances.toml ({fam}.{mode})", ts, [b[f"{what}_error"] * s for s in scale],
                          color="#c62828", style="dashed", width=1.4))
    return out


def _scale(b: dict, t: float) -> float:
    r = max(t / b["horizon"], 1.0)
    if "linear" in b["growth"]:
        return r
    if "sqrt" in b["growth"]:
        return math.sqrt(r)
    return 1.0


def _mode_plot(report, fam, dist, mode, cells, what: str, uid) -> str:
    sw = report["sweep"]
    series, tmax = [], float(report["settings"]["horizon"])
    for c in sorted(cells, key=lambda c: SCHEDULE_ORDER.index(c["schedule"])):
        blk = c[what]
        col = PALETTE[SCHEDULE_ORDER.index(c["schedule"]) % len(PALETTE)]
        lab = SCHEDULE_LABEL[c["schedule"]].format(L=sw["buffer"], T=sw["window"])
        law = (blk.get("fit") or {}).get("law", "?")
        series.append(Series(f"{lab}: {law}", blk["curve"]["t"], blk["curve"]["rms"], color=col, style="markers"))
        fc = blk.get("fit_curve")
        if fc:
            series.append(Series("", fc["t"], [v if v is not None else float("nan") for v in fc["e"]], color=col,
                                 style="dashed", legend=False, width=1.2))
        tmax = max(tmax, c["tokens"])
    series += _budget_series(report, fam, mode, cells, tmax, what)
    title = f"{fam} {mode} · {'output' if what == 'output' else 'state'} error"
    return render(Plot(title, "tokens (position in the accepted stream)", "RMS ||err|| / ||ref||", series,
                       width=350, height=310), uid())


def _flush_plots(report, fam, dist, cells, uid) -> tuple[str, str]:
    modes = [m for m in report["sweep"]["modes"]]
    acc, loc = [], []
    for i, m in enumerate(modes):
        mid = parse_mode(m).id
        c = next((c for c in cells if c["mode"] == mid and c["schedule"] == "standard"), None) or \
            next((c for c in cells if c["mode"] == mid), None)
        if c is None:
            continue
        col = PALETTE[i % len(PALETTE)]
        acc.append(Series(f"{mid} ({c['schedule']})", c["flush"]["curve"]["t"], c["flush"]["curve"]["rms"], color=col,
                          style="line+markers"))
        loc.append(Series(f"{mid}: {_fmt(c['flush']['injected']['estimate'])}/flush", c["flush"]["local_curve"]["t"],
                          c["flush"]["local_curve"]["rms"], color=col, style="line+markers"))
    a = render(Plot(f"{fam} · {dist} · checkpoint error at each flush", "flush number", "RMS ||ckpt - ref|| / ||ref||",
                    acc, width=560, height=340), uid())
    b = render(Plot(f"{fam} · {dist} · error injected by one flush", "flush number",
                    "RMS ||ckpt - fold64(prev ckpt)|| / ||.||", loc, width=560, height=340), uid())
    return a, b


def _h(value) -> Markup:
    """The template's ``h`` filter: ``html.escape`` (quotes as ``&quot;``/``&#x27;``), so the page keeps its bytes."""
    return Markup(escape(str(value)))


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("replayssm", "templates"), autoescape=True, trim_blocks=True,
                      lstrip_blocks=True, keep_trailing_newline=True, undefined=StrictUndefined)
    env.filters["h"] = _h
    env.filters["fmt"] = format
    return env


def _bits(ep: dict) -> dict | None:
    if not ep:
        return None
    return {"text": f"{_fmt(ep.get('bits_eff'), 3)} / {ep['bits_declared']:.3g} ({BASIS_MARK[ep['basis']]})",
            "worse": bool(ep.get("worse"))}


def to_html(report: dict) -> str:
    """A self-contained HTML page (inline CSS and SVG; no scripts, no external files), rendered by
    the template ``replayssm/templates/drift_report.html.j2`` (autoescaped)."""
    uid = _Ids()
    sw, st, chk = report["sweep"], report["settings"], report["check"]
    env = report.get("environment") or {}
    recommendations = []
    for r in report["recommendations"]:
        row = {k: r[k] for k in ("family", "kernel", "distribution", "schedule", "mode")}
        row["considered"] = ", ".join(f"{x['mode']} {_fmt(x['worst_output_error'], 2)}{'' if x['inside'] else ' ✗'}"
                                      for x in r["considered"])
        if r["mode"] is not None:
            t = r["traffic"]
            row.update(err=_fmt(r["output_error"]) + (" (extrapolated)" if r["extrapolated"] else ""),
                       state_bytes=f"{t['state_bytes_per_token']:,.0f}",
                       saved=f"{t['saved_bytes_per_token']:,.0f} B ({100 * t['saved_fraction']:.0f} %)")
        recommendations.append(row)
    cells = []
    for c in report["cells"]:
        inj = c["flush"]["injected"]
        chk_c = c["check"]
        cells.append({"name": _cell_name(c), "output_law": _law_text(c["output"]),
                      "output_peak": _fmt(c["output"]["peak"]), "state_law": _law_text(c["state"]),
                      "state_peak": _fmt(c["state"]["peak"]),
                      "injected": _fmt(inj.get("estimate")), "tokens_per_flush": _fmt(c["flush"]["tokens_per_flush"]),
                      "to_budget": _tokens((c["output"].get("budget_crossing") or {}).get("predicted")),
                      "bits_output": _bits(c["output"]["effective_precision"]),
                      "bits_state": _bits(inj.get("effective_precision") or {}),
                      "verdict": {"pass": c["verdict"]["pass"], "failures": "; ".join(c["verdict"]["failures"])},
                      "check": None if chk_c is None else {"pass": chk_c["pass"],
                                                           "failures": "; ".join(chk_c["failures"])}})
    by_group: dict[tuple, list[dict]] = {}
    for c in report["cells"]:
        by_group.setdefault((c["family"], c["kernel"], c["distribution"]), []).append(c)
    groups = []
    for (fam, ker, dist), cs in by_group.items():  # the plots' ids in page order: every mode plot, then the flushes
        plots = []
        for m in sw["modes"]:
            mid = parse_mode(m).id
            mc = [c for c in cs if c["mode"] == mid]
            if mc:
                plots.append((Markup(_mode_plot(report, fam, dist, mid, mc, "output", uid)),
                              Markup(_mode_plot(report, fam, dist, mid, mc, "state", uid))))
        groups.append({"family": fam, "kernel": ker, "distribution": dist, "mode_plots": plots, "cells": cs})
    for g in groups:
        g["flush_plots"] = [Markup(x) for x in _flush_plots(report, g["family"], g["distribution"], g["cells"], uid)]
    speculation = []
    for s in report["speculation"]:
        ci = s.get("ratio_ci_test") or s.get("ratio_ci95")
        tpf = s["tokens_per_flush"]
        speculation.append({**{k: s[k] for k in ("family", "kernel", "mode", "distribution", "schedule", "statement")},
                            "tokens_per_flush": f"{tpf['standard']:.3g} / {tpf['speculative']:.3g}",
                            "ratio": f"{_fmt(s.get('ratio'))} ({_fmt(ci[0]) if ci else '–'}–"
                                     f"{_fmt(ci[1]) if ci else '–'})",
                            "p": _fmt(s.get("p_value"), 2), "cls": "fail" if s.get("adds_error") else "",
                            "verdict": _verdict(s)})
    check_lines = [(kind, c["id"], line) for c in report["cells"]
                   for kind, key in (("fail", "failures"), ("warning", "warnings"))
                   for line in (c["check"] or {}).get(key, [])]
    return _environment().get_template("drift_report.html.j2").render(
        report=report, sw=sw, st=st, chk=chk, schema=SCHEMA,
        geo=", ".join(f"{k} = {v}" for k, v in sw["geometry"].items()),
        env_txt=", ".join(f"{k}: {v}" for k, v in env.items()) if env else "",
        check_text=(f"budget check PASS ({chk['cells']} cells)" if chk["pass"]
                    else f"budget check FAIL: {len(chk['failed'])} of {chk['cells']} cells") if chk["enabled"] else "",
        recommendations=recommendations, cells=cells, groups=groups, speculation=speculation,
        check_lines=check_lines, skipped=[(str(x.get("id", x.get("kernel"))), x["reason"]) for x in report["skipped"]])

def write_reports(report: dict, out_dir, stem: str = "drift_report") -> dict:
    """Write ``<stem>.json``, ``.md`` and ``.html`` atomically; returns their paths."""
    out = Path(out_dir)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "html": out / f"{stem}.html"}
    atomic_write(paths["json"], to_json(report))
    atomic_write(paths["md"], to_markdown(report, paths["html"].name))
    atomic_write(paths["html"], to_html(report))
    return paths


__all__ = ["SCHEMA", "SCHEMA_VERSION", "analyse", "to_html", "to_json", "to_markdown", "write_reports"]
