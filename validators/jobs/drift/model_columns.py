"""The drift report's model-level columns: the recommendation table read beside a ``replayssm model``
result (its ``model.json``), per precision mode k3-KL, p95 |Δlogprob| and the token count they were
measured at, and the cheapest mode the model level keeps inside its own budget.

Oracle: none (a join of two measured results).  The model result's runs are matched to a
recommendation row by family and mode; its schedule by name (``spec-random`` reads the model's
``random``, ``spec-always-1`` its ``always-1``, ``spec-always-T`` its ``always-T``); a drift schedule
without a model counterpart (``standard``) reads the worst over every schedule the model ran.  A model
result that is not one (wrong ``job``, a mutant run, missing fields) is refused with a ValueError naming
``--model-result``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from replayssm.precision import parse_mode

FLAG = "--model-result"
SCHEDULE_OF = {"spec-random": "random", "spec-always-1": "always-1", "spec-always-T": "always-T"}
METRICS = ("k3_kl", "kl_exact", "p95_abs_dlogprob", "max_abs_dlogprob", "top1_agreement", "tokens")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_model_result(data, name: str = "model.json") -> dict:
    """The parts of a ``replayssm model`` JSON result the drift report reads (ValueError naming
    ``--model-result`` and the bad field when it is not one)."""
    where = f"{FLAG}: {name}"
    if not isinstance(data, dict) or data.get("job") != "model":
        raise ValueError(f"{where}: expected the model.json of replayssm model (\"job\": \"model\")")
    if data.get("mutant"):
        raise ValueError(f"{where}: a mutant run ({data['mutant']}) measures no precision mode")
    for f in ("arch", "family", "kernel", "source", "teacher_dtype"):
        if not isinstance(data.get(f), str):
            raise ValueError(f"{where}: {f}: expected a string, got {data.get(f)!r}")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{where}: runs: expected a non-empty list")
    out = []
    for i, r in enumerate(runs):
        if not isinstance(r, dict) or not isinstance(r.get("schedule"), str) or not isinstance(r.get("metrics"), dict):
            raise ValueError(f"{where}: runs[{i}]: expected mode, schedule and metrics")
        try:
            mode = parse_mode(r.get("mode")).id
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"{where}: runs[{i}].mode: not a precision mode: {r.get('mode')!r}") from None
        bad = [m for m in METRICS if not _number(r["metrics"].get(m))]
        if bad:
            raise ValueError(f"{where}: runs[{i}].metrics: expected finite numbers for {bad}")
        out.append({"mode": mode, "schedule": r["schedule"], "verdict": r.get("verdict"),
                    **{m: r["metrics"][m] for m in METRICS}})
    return {"file": name, **{f: data[f] for f in ("arch", "family", "kernel", "source", "teacher_dtype")},
            "runs": out}


def load_model_result(path: str | Path) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{FLAG}: cannot read {p}: {e}") from None
    return parse_model_result(data, p.name)


def _worst(runs: list[dict]) -> dict:
    return {"k3_kl": max(r["k3_kl"] for r in runs), "kl_exact": max(r["kl_exact"] for r in runs),
            "p95_abs_dlogprob": max(r["p95_abs_dlogprob"] for r in runs),
            "max_abs_dlogprob": max(r["max_abs_dlogprob"] for r in runs),
            "top1_agreement": min(r["top1_agreement"] for r in runs), "tokens": min(r["tokens"] for r in runs),
            "schedules": [r["schedule"] for r in runs],
            "inside": all(r["verdict"] == "pass" for r in runs) if all(r["verdict"] in ("pass", "fail")
                                                                         for r in runs) else None}


def columns(model: dict | None, family: str, schedule: str, cost_key) -> dict | None:
    """The model-level entry of one recommendation row: ``per_mode`` ({mode: worst over the matched
    runs}), ``mode`` (the cheapest mode, by ``cost_key``, whose matched runs the model level judged
    inside its budget; None when none is or none was judged); None when ``model`` is None or of
    another family."""
    if model is None or model["family"] != family:
        return None
    want = SCHEDULE_OF.get(schedule)
    per_mode = {}
    for mode in sorted({r["mode"] for r in model["runs"]}, key=cost_key):
        runs = [r for r in model["runs"] if r["mode"] == mode]
        matched = [r for r in runs if r["schedule"] == want] or runs
        per_mode[mode] = _worst(matched)
    pick = next((m for m, v in per_mode.items() if v["inside"]), None)
    return {"per_mode": per_mode, "mode": pick}


__all__ = ["FLAG", "SCHEDULE_OF", "columns", "load_model_result", "parse_model_result"]
