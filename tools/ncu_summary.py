"""One Markdown table from Nsight Compute's text reports (``ncu --section ...`` output, as
``tools/ncu_split.sh`` writes them): per profiled launch its kernel, grid,
duration, DRAM / L1 / L2 / SM throughput (% of peak), registers, achieved and theoretical occupancy,
waves per SM, warp cycles per issued instruction and the stall the report's rules name first.

Oracle: the numbers are copied from the report, not recomputed; a metric the report lacks is "-".

    python tools/ncu_summary.py "GDN standard b8 replay=out/ncu_small_1.txt" ... > summary.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HEADER = re.compile(r"^  ([A-Za-z_]\w*) \(([\d, ]+)\)x\(([\d, ]+)\)", re.M)
METRICS = (("duration µs", "Duration"), ("DRAM %", "DRAM Throughput"), ("L1/TEX %", "L1/TEX Cache Throughput"),
           ("L2 %", "L2 Cache Throughput"), ("SM %", "Compute (SM) Throughput"),
           ("registers", "Registers Per Thread"), ("occupancy achieved", "Achieved Occupancy"),
           ("theoretical", "Theoretical Occupancy"), ("waves / SM", "Waves Per SM"),
           ("cycles / issue", "Warp Cycles Per Issued Instruction"))
STALL = re.compile(r"spends ([\d.]+) cycles being stalled (.*?)\.", re.S)


def metric(block: str, name: str) -> str:
    m = re.search(re.escape(name) + r"\s+\S+\s+([\d.,]+)\s*$", block, re.M)
    if m is None:
        m = re.search(re.escape(name) + r"\s+([\d.,]+)\s*$", block, re.M)
    return m.group(1) if m else "-"


def launches(text: str) -> list[dict]:
    """Every profiled launch of one report, in order."""
    heads = list(HEADER.finditer(text))
    out = []
    for i, h in enumerate(heads):
        block = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        row = {"kernel": h.group(1), "grid": h.group(2).replace(" ", ""), "block": h.group(3).split(",")[0]}
        row.update({label: metric(block, name) for label, name in METRICS})
        stall = STALL.search(block)
        row["first stall named"] = ("-" if stall is None else
                                    f"{stall.group(1)} cycles {' '.join(stall.group(2).split())[:60]}")
        out.append(row)
    return out


def table(reports: list[tuple[str, str]]) -> str:
    cols = ["case", "kernel", "grid x block"] + [label for label, _ in METRICS] + ["first stall named"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for label, text in reports:
        rows = launches(text)
        if not rows:
            lines.append(f"| {label} | (no profiled launch in the report) |" + " |" * (len(cols) - 2))
        for r in rows:
            cells = [label, r["kernel"], f"({r['grid']}) x {r['block']}"] + [r[k] for k, _ in METRICS]
            lines.append("| " + " | ".join(cells + [r["first stall named"]]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", help="LABEL=PATH of an ncu text report")
    a = p.parse_args(argv)
    reports = []
    for item in a.reports:
        label, sep, path = item.rpartition("=")
        if not sep or not path:
            p.error(f"reports: expected LABEL=PATH, got {item!r}")
        if not Path(path).is_file():
            p.error(f"reports: {path!r} is not a file")
        reports.append((label, Path(path).read_text(errors="replace")))
    sys.stdout.write(table(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
