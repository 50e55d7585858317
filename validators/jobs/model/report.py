"""The model job's outputs: ``model.json`` (every number), ``model.md`` (the table per precision mode
and schedule, the budgets, the engagement counters, how the random weights were scaled),
``model.html`` (the same table and one plot of |Δlogprob| against tokens per run, rendered by the
template ``replayssm/templates/model_report.html.j2`` with svg_plot's SVG) and the records of
``--record`` (one per mode x schedule: ``<family>/<kernel>/<mode>/model-<arch>/<schedule>``).

Oracle: none (formatting of numbers ``job.run`` measured).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from replayssm.records.record import Recorder
from replayssm.validators.jobs.drift.svg_plot import PALETTE, Plot, Series, render


def _series(values: list, bins: int = 16) -> list:
    """|Δlogprob| against tokens, as the max per bin (the JSON's plot data)."""
    if not values:
        return []
    n = len(values)
    step = max(1, -(-n // bins))
    return [{"tokens": min(n, i + step), "max_abs_dlogprob": max(values[i:i + step])} for i in range(0, n, step)]


def to_json(report: dict) -> dict:
    out = dict(report)
    out["runs"] = [{**{k: v for k, v in r.items() if k != "abs_dlogprob"},
                    "dlogprob_vs_tokens": _series(r["abs_dlogprob"])} for r in report["runs"]]
    return out


def to_markdown(report: dict) -> str:
    r = report
    lines = [f"# replayssm model: {r['arch']} / {r['kernel']}" + (f" (mutant {r['mutant']})" if r["mutant"] else ""),
             "", f"- model: {r['source']}; layers {r['layers']}; {r['mixers']} {r['family']} mixers, geometry "
             f"{r['geometry']}",
             f"- teacher: the same model's prefill with the recurrence in fp64, every other layer in "
             f"{r['teacher_dtype']}" + ("" if r["teacher_dtype"] == "float64" else " (fp64 does not run: said here)"),
             f"- stream: {r['tokens']} positions of {r['stream']}; speculative T' = {r['window']}, B = {r['buffer']}",
             f"- teacher next-token entropy {r['entropy']:.3f} nats of ln(vocab) = {r['entropy_max']:.3f}"
             + (f" (LM head scaled x{r['head_scale']:.3g} to reach it)" if r["head_scale"] else ""),
             "", "| mode | schedule | k3-KL | KL | p95 abs dlogprob | max abs dlogprob | top-1 | flushes | wraps "
             "| rejected | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in r["runs"]:
        m, e = x["metrics"], x["engagement"]
        lines.append(f"| {x['mode']} | {x['schedule']} | {m['k3_kl']:.3g} | {m['kl_exact']:.3g} | "
                     f"{m['p95_abs_dlogprob']:.3g} | {m['max_abs_dlogprob']:.3g} | {m['top1_agreement']:.3f} | "
                     f"{e['flushes']} | {e['wraps']} | {e['rejected_tokens']} | {x['verdict']} |")
    fails = [f"- {x['mode']} {x['schedule']}: " + "; ".join(x["failures"]) for x in r["runs"] if x["failures"]]
    if fails:
        lines += ["", "## Outside budget", "", *fails]
    where = f"`[model.{r['family']}.\"<mode>\"]` of golden/tolerances.toml"
    lines += ["", f"Verdict: **{r['verdict']}** (budgets: {where})", "",
              "Plots of |Δlogprob| against tokens, one per run: [model.html](model.html).", ""]
    return "\n".join(lines)


RUN_COLORS = tuple(c for c in PALETTE if c != "#d62728")  # red is the budget's


def log_bins(values: list, bins: int = 40) -> dict:
    """``values`` (one per position) over log-spaced bins of the token count: ``{"t": the bin's last token
    count, "max": ..., "mean": ...}``; every position its own bin while there are at most ``bins``."""
    n = len(values)
    edges = sorted({min(n, max(1, round(math.exp(i * math.log(n) / bins)))) for i in range(1, bins + 1)}) if n else []
    out = {"t": [], "max": [], "mean": []}
    lo = 0
    for hi in edges:
        if hi <= lo:
            continue
        chunk = values[lo:hi]
        out["t"].append(hi)
        out["max"].append(max(chunk))
        out["mean"].append(sum(chunk) / len(chunk))
        lo = hi
    return out


def _run_plot(report: dict, x: dict, i: int) -> str:
    b = log_bins(x["abs_dlogprob"])
    col = RUN_COLORS[i % len(RUN_COLORS)]
    series = [Series("max per bin", b["t"], b["max"], color=col, style="line+markers"),
              Series("mean per bin", b["t"], b["mean"], color=col, style="dashed")]
    budget = x.get("budget")
    if budget:
        series += [Series(f"p95 budget {budget['p95_abs_dlogprob']:.3g}", [1, report["tokens"]],
                          [budget["p95_abs_dlogprob"]] * 2, color="#c62828", style="hline", width=1.2),
                   Series(f"max budget {budget['max_abs_dlogprob']:.3g}", [1, report["tokens"]],
                          [budget["max_abs_dlogprob"]] * 2, color="#999999", style="hline", width=1.2)]
    title = f"{x['mode']} · {x['schedule']} · {x['verdict']}"
    return render(Plot(title, "tokens (positions judged)", "|Δlogprob|", series, logx=True, logy=True,
                       width=440, height=320, note="every |Δlogprob| is 0"), f"run{i}")


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("replayssm", "templates"), autoescape=True, trim_blocks=True,
                      lstrip_blocks=True, keep_trailing_newline=True, undefined=StrictUndefined)
    env.filters["fmt"] = format
    return env


def to_html(report: dict) -> str:
    """A self-contained page (inline CSS and SVG, no scripts): the runs' table and one plot of |Δlogprob|
    against tokens per run (mode x schedule); ``report`` is ``job.run``'s (with the per-position values)."""
    rows = []
    for x in report["runs"]:
        m, e = x["metrics"], x["engagement"]
        rows.append({"mode": x["mode"], "schedule": x["schedule"], "k3_kl": f"{m['k3_kl']:.3g}",
                     "kl": f"{m['kl_exact']:.3g}", "p95": f"{m['p95_abs_dlogprob']:.3g}",
                     "max": f"{m['max_abs_dlogprob']:.3g}", "top1": f"{m['top1_agreement']:.3f}",
                     "flushes": e["flushes"], "wraps": e["wraps"], "rejected": e["rejected_tokens"],
                     "verdict": x["verdict"], "failures": "; ".join(x["failures"])})
    plots = [Markup(_run_plot(report, x, i)) for i, x in enumerate(report["runs"])]
    return _environment().get_template("model_report.html.j2").render(
        r=report, geometry=", ".join(f"{k} = {v}" for k, v in report["geometry"].items() if k != "family"),
        rows=rows, plots=plots)


def write(report: dict, out: str | Path) -> list[Path]:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    j, m, h = d / "model.json", d / "model.md", d / "model.html"
    j.write_text(json.dumps(to_json(report), indent=1, sort_keys=True) + "\n")
    m.write_text(to_markdown(report))
    h.write_text(to_html(report))
    return [j, m, h]


def records(recorder: Recorder, report: dict, options: dict | None = None) -> list[dict]:
    out = []
    for x in report["runs"]:
        metrics = {**x["metrics"], **x["engagement"], "entropy": report["entropy"], "wall_s": x["wall_s"]}
        metrics.pop("non_finite", None)
        verdict = {"pass": "pass", "fail": "fail"}.get(x["verdict"], "none")
        case = f"{report['family']}/{report['kernel']}/{x['mode']}/model-{report['arch']}/{x['schedule']}"
        if report["mutant"]:
            case += f"/{report['mutant']}"
        out.append(recorder.record(
            case, metrics=metrics, verdict=verdict, reason="; ".join(x["failures"]) or None,
            config={"source": report["source"], "tokens": report["tokens"], "window": report["window"],
                    "buffer": report["buffer"], "seed": report["seed"], "mutant": report["mutant"],
                    "teacher_dtype": report["teacher_dtype"], "layers": report["layers"], **(options or {})},
            family=report["family"], kernel=report["kernel"], mode=x["mode"], geometry=f"model-{report['arch']}"))
    return out
