"""The static results page (``replayssm results page OUT.html``): verdicts, state bits, kernel
times and suite throughput by commit x GPU x kernel, from the records' index, rendered by the
jinja2 template ``replayssm/templates/results_page.html.j2`` (autoescaped) with the SVG plots of
:mod:`svg_plot` (deterministic text).

Oracle: the records; the page shows their values (3 significant digits) and ids, nothing else.
The same index gives the same bytes (rows sorted, no clock read).
"""

from __future__ import annotations

import math

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from replayssm.records.gate import findings
from replayssm.records.index import Index
from replayssm.validators.jobs.drift.svg_plot import PALETTE, Plot, Series, render


def environment() -> Environment:
    """The templates of the package (``replayssm/templates``), autoescaped."""
    return Environment(loader=PackageLoader("replayssm", "templates"), autoescape=True, undefined=StrictUndefined,
                       keep_trailing_newline=True)


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _commit(r: dict) -> str:
    return r["commit_id"] + ("+dirty" if r["dirty"] else "")


def _order(index: Index) -> dict[str, int]:
    """Commits in the order of their first record (the x axis of the plots)."""
    first: dict[str, str] = {}
    for r in index.rows():
        c = r["commit_id"]
        first[c] = min(first.get(c, r["created"]), r["created"])
    return {c: i for i, c in enumerate(sorted(first, key=lambda c: (first[c], c)))}


def _plots(points: dict[tuple, list[tuple[int, float]]], title: str, ylabel: str, uid: str) -> list[str]:
    """One plot per device: a series per label, value by commit index."""
    by_dev: dict[str, list] = {}
    for (dev, label), pts in sorted(points.items()):
        by_dev.setdefault(dev, []).append((label, sorted(pts)))
    out = []
    for i, (dev, series) in enumerate(sorted(by_dev.items())):
        ss = [Series(label, [float(x) for x, _ in pts], [y for _, y in pts], color=PALETTE[j % len(PALETTE)],
                     style="line+markers") for j, (label, pts) in enumerate(series[:len(PALETTE)])]
        out.append(Markup(render(Plot(f"{title}: {dev}", "commit (in order of first record)", ylabel, ss,
                                      logx=False, logy=True, width=520, height=320), uid=f"{uid}{i}")))
    return out


def page(index: Index, title: str = "replayssm results", sources=()) -> str:
    """The page's HTML."""
    order = _order(index)
    control = {f["id"]: f["control"] for f in findings(
        [{"id": r["id"], "job": r["job"], "case": r["case_id"], "kernel": r["kernel"], "verdict": r["verdict"]}
         for r in index.latest()])}
    verdicts = [{**r, "commit": _commit(r), "control": control.get(r["id"], "-")}
                for r in index.latest() if r["verdict"] != "none"]
    bits, times, throughput = [], [], []
    time_pts: dict[tuple, list] = {}
    rate_pts: dict[tuple, list] = {}
    for r in index.rows():
        m = index.metrics(r["id"])
        base = {**r, "commit": _commit(r)}
        if r["job"] == "drift" and "state_bits_eff" in m:
            bits.append({**base, "state_bits": fmt(m.get("state_bits_eff")),
                         "output_bits": fmt(m.get("output_bits_eff")), "declared": fmt(m.get("state_bits_declared"))})
        us = m.get("us", m["median_s"] * 1e6 if isinstance(m.get("median_s"), float) else None)
        if r["job"] == "bench" and not r["case_id"].startswith("suite/") and isinstance(us, float):
            times.append({**base, "us": fmt(us), "tbps": fmt(m.get("tbps")), "pct_copy": fmt(m.get("pct_copy"))})
            time_pts.setdefault((r["device_name"], r["case_id"]), []).append((order[r["commit_id"]], us))
        for key, unit in (("tokens_per_s", "tokens/s"), ("scenarios_per_s", "scenarios/s")):
            v = m.get(key)
            if isinstance(v, float) and math.isfinite(v) and v > 0 and (r["job"] != "validate" or key != "tokens_per_s"
                                                                       or r["verdict"] == "pass"):
                throughput.append({**base, "value": fmt(v), "unit": unit})
                rate_pts.setdefault((r["device_name"], f"{r['case_id']} ({unit})"), []).append(
                    (order[r["commit_id"]], v))
    key = lambda r: (order[r["commit_id"]], r["device_name"], r["kernel"] or "", r["case_id"], r["id"])
    return environment().get_template("results_page.html.j2").render(
        title=title, n_records=len(index), sources=list(sources) or ["(records given)"],
        commits=sorted(order, key=order.get), devices=index.values("device_name"),
        verdicts=verdicts, bits=sorted(bits, key=key), times=sorted(times, key=key),
        throughput=sorted(throughput, key=key),
        time_plots=_plots(time_pts, "kernel time", "µs per step", "t"),
        throughput_plots=_plots(rate_pts, "throughput", "per second", "r"))


__all__ = ["environment", "fmt", "page"]
