"""The tables of docs/benchmarks.md from a saved benchmark run (pytest-benchmark JSON of tests/bench,
``nox -s bench``, or a ``replayssm bench --json`` result: the launch-sweep tables, baseline against
replay per row).

    python -m replayssm.validators.jobs.bench.table RUN.json                  # Markdown tables

Two runs are compared, and gated, as records: ``replayssm results gate BASE NEW --by source
--ledger BASE/kernels.json --ledger NEW/kernels.json`` (what ``nox -s bench -- --baseline`` runs).

Oracle of the numbers: nothing is recomputed from a model here except the ratio and the model limit;
every time is the run's own median (pytest-benchmark ``stats.median``, seconds per decode step for a
kernel case), every bandwidth the run's ``extra_info`` (modelled bytes over that median, and the copy
ceiling measured in the same run).  A kernel case's ``extra_info`` comes from
``validators.bench.measure_case``; the suite-speed benchmarks carry ``tokens_per_s`` or
``scenarios_per_s``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from replayssm.validators.jobs.bench.run import table

OURS = ("triton-baseline", "triton-replay")  # the ratio column: baseline µs over replay µs


def fmt(v) -> str:
    """One table cell: 3 significant digits below 100, whole numbers above (as docs/benchmarks.md)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def is_bench_result(data: dict) -> bool:
    """A ``replayssm bench --json`` result (``validators.bench.bench_family``), not a pytest-benchmark run."""
    return isinstance(data.get("rows"), list) and {"family", "copy", "env"} <= set(data)


def load_runs(paths) -> list[dict]:
    """The JSON of each path: a pytest-benchmark run or a ``replayssm bench`` result; ValueError
    naming a file that is neither."""
    runs = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"run: cannot read {p} as JSON ({e})") from None
        if not (isinstance(data, dict) and (isinstance(data.get("benchmarks"), list) or is_bench_result(data))):
            raise ValueError(f"run: {p} is not pytest-benchmark JSON (no 'benchmarks' list; save one with "
                             f"--benchmark-json) nor a replayssm bench --json result")
        runs.append(data)
    return runs


def _label(e: dict) -> str:
    if e["decode"] == "standard":
        return f"standard L={e['buffer']}" if e["kind"] == "replay" else "standard"
    return f"spec T'={e['window']} B={e['buffer']} {e['accepted']} accepted"


def _row_key(e: dict) -> tuple:
    # a baseline's standard case has no ring (buffer 1): it sits in the row of the replay's L
    return (e["decode"] != "standard", e["accepted"], e["batch"])


def kernel_cases(run: dict) -> list[dict]:
    """The kernel benchmarks of a run: ``extra_info`` with ``median_us`` from the statistics."""
    out = []
    for b in run["benchmarks"]:
        e = b.get("extra_info", {})
        if "case" in e:
            out.append({**e, "median_us": b["stats"]["median"] * 1e6, "iqr_us": b["stats"]["iqr"] * 1e6,
                        "rounds": b["stats"]["rounds"]})
    return out


def header(run: dict) -> str:
    m, c = run.get("machine_info", {}), run.get("commit_info", {})
    gpu = next((b["extra_info"].get("gpu") for b in run["benchmarks"] if b.get("extra_info", {}).get("gpu")), None)
    dirty = " (dirty)" if c.get("dirty") else ""
    commit = c.get("id") or next((b["extra_info"]["commit"] for b in run["benchmarks"]
                                  if b.get("extra_info", {}).get("commit")), "?")  # a copy without .git
    parts = [f"run {run.get('datetime', '?')}", f"commit {commit[:12]}{dirty}",
             f"python {m.get('python_version', '?')}",
             f"machine {m.get('node', '?')} {m.get('cpu', {}).get('brand_raw', '')}".rstrip()]
    if gpu:
        parts.insert(1, gpu)
    copies = sorted({e["copy_tbps"] for e in kernel_cases(run) if e.get("copy_tbps")})
    if copies:
        parts.append(f"copy {copies[0]:.3f} TB/s")
    return ", ".join(parts)


def family_table(cases: list[dict]) -> str:
    """One family's table: a row per (decode case, batch), per kernel its median µs and TB/s (% copy),
    the ratio of our baseline over our replay kernel and the bytes-model limit of that ratio."""
    kern = sorted({e["kernel"] for e in cases}, key=lambda k: (k not in OURS, k))
    rows: dict[tuple, dict[str, dict]] = {}
    for e in cases:
        rows.setdefault(_row_key(e), {})[e["kernel"]] = e
    heads = ["case", "batch"]
    for k in kern:
        heads += [f"{k} µs", f"{k} TB/s (% copy)"]
    heads += ["ratio", "model limit"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for key in sorted(rows):
        by = rows[key]
        first = by.get(OURS[1]) or next(iter(by.values()))
        cells = [_label(first), str(first["batch"])]
        for k in kern:
            e = by.get(k)
            if e is None:
                cells += ["-", "-"]
                continue
            pct = f" ({e['pct_copy']:.0f}%)" if e.get("pct_copy") is not None else ""
            cells += [fmt(e["median_us"]), f"{fmt(e['tbps'])}{pct}"]
        b, r = by.get(OURS[0]), by.get(OURS[1])
        cells += [fmt(b["median_us"] / r["median_us"]) if b and r else "-",
                  fmt(b["bytes_per_step"] / r["bytes_per_step"]) if b and r else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def suite_table(run: dict) -> str | None:
    rows = []
    for b in run["benchmarks"]:
        e = b.get("extra_info", {})
        for key, unit in (("tokens_per_s", "validated tokens/s"), ("scenarios_per_s", "scenarios/s")):
            if key in e:
                rows.append(f"| {b['group']} | {e.get('family', '-')} | {e.get('kernel', '-')} | "
                            f"{fmt(b['stats']['median'])} s | {e[key]:,.1f} {unit} |")
    if not rows:
        return None
    head = "| benchmark | family | kernel | median per round | throughput |"
    return "\n".join([head, "|---|---|---|---|---|", *rows])


def render(run: dict) -> str:
    """The Markdown of one run: a header line, one table per family, the suite-speed table (a
    ``replayssm bench`` result: its header line and its baseline-against-replay table)."""
    if is_bench_result(run):
        e = run["env"]
        return (f"{e.get('gpu', 'no GPU')}, torch {e.get('torch')}, triton {e.get('triton')}, commit "
                f"{e.get('commit')}{' (dirty)' if e.get('dirty') else ''}, {e.get('date')}, copy "
                f"{run['copy']['tbps']:.3f} TB/s; {run['family']} {run['geometry']} {run['mode']}\n\n{table(run)}\n")
    cases = kernel_cases(run)
    out = [header(run)]
    for fam in dict.fromkeys(e["family"] for e in cases):
        fc = [e for e in cases if e["family"] == fam]
        geo = sorted({e["geometry"] for e in fc})
        modes = sorted({e["mode"] for e in fc})
        out += ["", f"## {fam} ({', '.join(geo)}, {', '.join(modes)})", "", family_table(fc)]
    suite = suite_table(run)
    if suite:
        out += ["", "## suite speed", "", suite]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m replayssm.validators.jobs.bench.table",
                                description=__doc__.split("\n")[0])
    p.add_argument("run", help="pytest-benchmark JSON (nox -s bench writes out/bench/kernels.json) or a "
                                "replayssm bench --json result")
    args = p.parse_args(argv)
    try:
        runs = load_runs([args.run])
    except ValueError as e:
        print(f"bench_table: {e}", file=sys.stderr)
        return 2
    print(render(runs[0]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
