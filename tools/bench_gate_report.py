"""Report of tools/bench_gate_h200.sh: the run-to-run noise of the benchmark gate's cases and what the
gate decided, from the three runs' JSON (``nox -s bench -- --gate --out DIR``).

    python tools/bench_gate_report.py A B C --rc RC_A RC_B RC_C [--slow triton-replay=0.5]

A and B are two runs of the same commit (B compared against A by ``nox -s bench``), C a run with the
test-only slowdown ``REPLAYSSM_BENCH_SLOW`` compared against A.  Printed (Markdown): per part
(kernels, suite) the per-case change A -> B (noise) and A -> C, the largest same-commit change, the
threshold it suggests (3 x the largest change, at least 5 %), whether B passed and C failed the gate
at the noxfile's thresholds, and which cases C failed (they should be exactly the slowed kernel's).
Exit status 0 when the gate behaved (A and B passed, C failed on the slowed kernel's cases only,
every one of them), 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from replayssm.validators.bench_table import compare, load_runs, render

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("kernels", "suite")


def thresholds() -> dict[str, int]:
    """The thresholds the noxfile states (read from its source, so the report uses what the gate used)."""
    text = (ROOT / "noxfile.py").read_text()
    out = {}
    for part, var in (("kernels", "KERNEL_THRESHOLD_PCT"), ("suite", "SUITE_THRESHOLD_PCT")):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{var} ="))
        out[part] = int(line.split("=")[1].split("#")[0])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("c")
    p.add_argument("--rc", type=int, nargs=3, required=True, metavar=("RC_A", "RC_B", "RC_C"))
    p.add_argument("--slow", default="triton-replay=0.5", help="the REPLAYSSM_BENCH_SLOW of run C")
    args = p.parse_args(argv)
    slowed = {item.split("=")[0] for item in args.slow.split(",") if item}
    limits = thresholds()
    ok = args.rc[0] == 0 and args.rc[1] == 0 and args.rc[2] != 0
    out = [f"# Benchmark gate on this machine\n\nexit status: run A {args.rc[0]}, run B (same commit vs A) "
           f"{args.rc[1]}, run C ({args.slow} vs A) {args.rc[2]}; noxfile thresholds {limits}\n"]
    for part in PARTS:
        files = [Path(d, f"{part}.json") for d in (args.a, args.b, args.c)]
        if not all(f.is_file() for f in files):
            out.append(f"## {part}\n\nmissing: {[str(f) for f in files if not f.is_file()]}\n")
            ok = False
            continue
        a, b, c = load_runs(files)
        noise_text, noise = compare(a, b, limits[part])
        slow_text, slow = compare(a, c, limits[part])
        suggested = max(5, math.ceil(3 * noise["worst_abs"]))
        over_c = set(slow["over"])
        expect_c = {bench["fullname"].split("::")[-1] for bench in c["benchmarks"]
                    if bench.get("extra_info", {}).get("kernel") in slowed and "case" in bench.get("extra_info", {})}
        # The gate works when nothing moved beyond the threshold between two runs of one commit, and
        # the slowed run trips it on the slowed kernel's cases only (at least one where the kernel is
        # in this part).  A slowed case may stay within the threshold: the extra pass is FRACTION x the
        # step's modelled bytes, small against a step that runs far below the copy ceiling.
        part_ok = not noise["over"] and over_c <= expect_c and bool(over_c) == bool(expect_c)
        ok = ok and part_ok
        within = sorted(expect_c - over_c)
        out += [f"## {part}: noise (A -> B, same commit)\n", noise_text,
                f"largest change either way **{noise['worst_abs']:.2f} %** over {noise['compared']} benchmarks; "
                f"suggested threshold max(5, 3 x that) = **{suggested} %** (noxfile: {limits[part]} %)\n",
                f"## {part}: slowed (A -> C, {args.slow})\n", slow_text,
                f"over the threshold: {sorted(over_c) or 'none'}; expected (the slowed kernel's cases): "
                f"{sorted(expect_c) or 'none'}; {'as expected' if part_ok else 'NOT as expected'}"
                + (f" (slowed but within the threshold: {within})" if within else "") + "\n"]
    kernels_a = Path(args.a, "kernels.json")
    if kernels_a.is_file():
        out += ["## Tables of run A (python -m replayssm.validators.bench_table A/kernels.json)\n",
                render(load_runs([kernels_a])[0])]
    out.append(f"\n**gate {'behaved' if ok else 'did NOT behave'} as intended**\n")
    print("\n".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
