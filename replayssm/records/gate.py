"""The benchmark gate on records: per case in both sides, the change of the median time (slower
positive) against a threshold per part (``kernels``: CUDA-graph replays of one kernel case;
``suite``: the suite's own speed), and the run-to-run noise of a same-commit pair.  Also the
records of a pytest-benchmark run (``nox -s bench`` writes ``kernels.json``/``suite.json``),
and the rule of the findings: a verdict on a kernel written elsewhere counts only where ours (a
correct implementation) passes the same run.

Oracle: the runs' own medians (pytest-benchmark ``stats.median``, seconds per round); nothing is
recomputed but the change in percent.
"""

from __future__ import annotations

import math

from replayssm.records.record import Recorder

# The thresholds of the gate (`nox -s bench -- --baseline DIR` and `replayssm results gate`): a part
# fails when a median is this many percent slower than the baseline's.  Chosen from the run-to-run
# noise that the bench-gate profile measured on one H200 (rec:03c87d1ae72464e2, rec:aa199ad1422fd1c1):
# 3 x the worst change between two runs of one commit, and never below 5.  Kernel cases (CUDA-graph
# replays): worst same-commit change 0.15 % over 18 cases; the suite's speed (host-bound drift
# chunks): worst same-commit change 20.9 %, IQR to 58 %.
THRESHOLDS = {"kernels": 5.0, "suite": 63.0}
OURS = ("triton-baseline", "triton-replay")  # our kernels: the findings' control


def part_of(record: dict) -> str:
    """``kernels`` for a kernel case, ``suite`` for the suite's speed."""
    return "suite" if record["case"].startswith("suite/") else "kernels"


def _name(b: dict) -> str:
    return b["fullname"].split("::")[-1]


def from_pytest_benchmark(run: dict, source: str | None = None) -> list[dict]:
    """One ``bench`` record per benchmark of a pytest-benchmark run: a kernel case (its
    ``extra_info`` names ``case``) as ``<family>/<kernel>/<mode>/<geometry>/<case id>``, a
    suite-speed benchmark as ``suite/<test name>``; metrics the median, IQR and rounds (seconds per
    round) and the numeric ``extra_info`` (µs, TB/s, % copy, tokens/s...).  Provenance from the
    run's ``commit_info`` and ``machine_info`` (the GPU from a case's ``extra_info``)."""
    c, m = run.get("commit_info") or {}, run.get("machine_info") or {}
    commit = str(c.get("id") or "unknown")[:12].lower() or "unknown"
    gpu = next((b["extra_info"]["gpu"] for b in run["benchmarks"] if (b.get("extra_info") or {}).get("gpu")), None)
    device = ({"kind": "cuda", "name": gpu, "driver": None} if gpu else
              {"kind": "cpu", "name": (m.get("cpu") or {}).get("brand_raw") or m.get("processor") or "cpu",
               "driver": None})
    versions = {"python": m.get("python_version", "unknown"), "torch": "unknown", "replayssm": "unknown",
                "triton": None}
    created = run.get("datetime")
    if created:
        created = created.split(".")[0].replace("+00:00", "") + "Z"
    rec = Recorder("bench", commit=commit, dirty=bool(c.get("dirty")), device_info_=device, versions_=versions,
                   source=source)
    out = []
    for b in run["benchmarks"]:
        e = dict(b.get("extra_info") or {})
        s = b["stats"]
        metrics = {"median_s": s["median"], "iqr_s": s["iqr"], "rounds": s["rounds"], "benchmark": _name(b),
                   **{k: v for k, v in e.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}
        if "case" in e:
            case = f"{e.get('family')}/{e.get('kernel')}/{e.get('mode')}/{e.get('geometry')}/{e['case']}"
        else:
            case = f"suite/{_name(b)}"
        out.append(rec.record(case, metrics=metrics, verdict="none", created=created,
                              config={"group": b.get("group"), "params": b.get("params"),
                                      "extra": {k: v for k, v in e.items() if not isinstance(v, (int, float))}},
                              family=e.get("family"), kernel=e.get("kernel"), mode=e.get("mode"),
                              geometry=e.get("geometry")))
    return out


def median_s(record: dict) -> float | None:
    """A record's time (seconds; smaller is faster): ``median_s``, else ``us`` (a ``bench`` row)."""
    m = record["metrics"]
    v = m.get("median_s")
    if v is None and m.get("us") is not None:
        v = m["us"] * 1e-6
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 else None


def _device(r: dict) -> str:
    return (r.get("device") or {}).get("name") or r.get("device_name") or "?"


def compare(base: list[dict], new: list[dict], threshold_pct: float | None = None) -> tuple[str, dict]:
    """Per case and device timed in both (new's order; a device compares with itself only; the
    device is named after the case when the new side has several): both medians, the change in percent (slower
    positive), the base's IQR over its median; and a summary: ``worst_slowdown``, ``worst_abs``
    (largest change either way: the noise of a same-commit pair), ``over`` (benchmarks beyond
    ``threshold_pct``), ``compared``."""
    old = {(r["case"], _device(r)): r for r in base}
    several = len({_device(r) for r in new}) > 1
    lines = ["| benchmark | base median | new median | change | base IQR / median |", "|---|---|---|---|---|"]
    summary = {"worst_slowdown": 0.0, "worst_abs": 0.0, "over": [], "compared": 0}
    for r in new:
        a = old.get((r["case"], _device(r)))
        m0, m1 = (None, None) if a is None else (median_s(a), median_s(r))
        if m0 is None or m1 is None:
            continue
        ch = 100 * (m1 - m0) / m0
        name = (r["metrics"].get("benchmark") or r["case"]) + (f" on {_device(r)}" if several else "")
        summary["compared"] += 1
        summary["worst_slowdown"] = max(summary["worst_slowdown"], ch)
        summary["worst_abs"] = max(summary["worst_abs"], abs(ch))
        over = threshold_pct is not None and ch > threshold_pct
        if over:
            summary["over"].append(name)
        iqr = a["metrics"].get("iqr_s")
        lines.append(f"| {name} | {m0 * 1e6:.4g} µs | {m1 * 1e6:.4g} µs | {ch:+.2f} %{' **over**' if over else ''} | "
                     + (f"{100 * iqr / m0:.2f} % |" if isinstance(iqr, (int, float)) else "- |"))
    return "\n".join(lines) + "\n", summary


def gate(base: list[dict], new: list[dict], thresholds: dict | None = None) -> tuple[str, bool]:
    """The gate: per part, :func:`compare` at its threshold; passes when nothing is over and
    something was compared.  Returns (Markdown, passed)."""
    thresholds = {**THRESHOLDS, **(thresholds or {})}
    out, ok = [], True
    for part in ("kernels", "suite"):
        b = [r for r in base if part_of(r) == part]
        n = [r for r in new if part_of(r) == part]
        if not n:
            continue
        text, s = compare(b, n, thresholds[part])
        ok = ok and not s["over"] and s["compared"] > 0
        out += [f"## {part} (threshold {thresholds[part]:g} %)\n", text,
                f"{s['compared']} compared; largest slowdown {s['worst_slowdown']:+.2f} %, largest change either way "
                f"{s['worst_abs']:.2f} %; over: {', '.join(s['over']) or 'none'}\n"]
    if not out:
        return "nothing to compare: the new side has no timed record\n", False
    out.append(f"**gate {'PASS' if ok else 'FAIL'}**\n")
    return "\n".join(out), ok


def findings(records: list[dict]) -> list[dict]:
    """The findings' rule over validate/findings records: per (family, mode, geometry, case tail)
    a kernel's verdict counts (``counts``: True) only where every one of our kernels run on the
    same case passed; where ours failed too the run says nothing about the other kernel."""
    by: dict[tuple, list[dict]] = {}
    for r in records:
        if r["job"] not in ("validate", "findings"):
            continue
        parts = r["case"].split("/")
        key = (parts[0], *parts[2:])  # the case without the kernel
        by.setdefault(key, []).append(r)
    out = []
    for _key, rs in sorted(by.items()):
        ours = [r for r in rs if r.get("kernel") in OURS]
        control = bool(ours) and all(r["verdict"] == "pass" for r in ours)
        for r in rs:
            out.append({"case": r["case"], "kernel": r.get("kernel"), "verdict": r["verdict"], "id": r["id"],
                        "counts": r.get("kernel") in OURS or control,
                        "control": "ours pass" if control else ("ours fail" if ours else "no control run")})
    return out


__all__ = ["OURS", "THRESHOLDS", "compare", "findings", "from_pytest_benchmark", "gate", "median_s", "part_of"]
