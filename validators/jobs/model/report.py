"""The model job's outputs: ``model.json`` (every number), ``model.md`` (the table per precision mode
and schedule, the budgets, the engagement counters, how the random weights were scaled) and the
records of ``--record`` (one per mode x schedule: ``gdn/<kernel>/<mode>/model-<arch>/<schedule>``).

Oracle: none (formatting of numbers ``job.run`` measured).
"""

from __future__ import annotations

import json
from pathlib import Path

from replayssm.records.record import Recorder


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
    lines += ["", f"Verdict: **{r['verdict']}** (budgets: {where})", ""]
    return "\n".join(lines)


def write(report: dict, out: str | Path) -> list[Path]:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    j, m = d / "model.json", d / "model.md"
    j.write_text(json.dumps(to_json(report), indent=1, sort_keys=True) + "\n")
    m.write_text(to_markdown(report))
    return [j, m]


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
