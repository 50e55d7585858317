"""Run one small validate per kernel under NVIDIA compute-sanitizer (initcheck and memcheck), caching allocator off.

Oracle: compute-sanitizer's own: ``initcheck`` reports device reads of memory never written
(a kernel reading an uninitialised slab: what ``--poison-allocations`` shows in values, seen at
the byte level), ``memcheck`` out-of-bounds and misaligned accesses (an index derived from an
accepted count, a padding row's slot -1, a strided column read with unit stride).  With
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` every tensor is its own allocation, so an access past a
tensor is past an allocation.  Each run: ``replayssm validate`` of one kernel on the tiny
scenario (6 steps, speculative and standard), ``--device cuda``; the verdict is the sanitizer's
``ERROR SUMMARY`` (0 errors) and the validate exit code (0).  GPU only: ``nox -s sanitize``
(writes ``out/sanitize/summary.json``), or ``python tools/sanitize.py --out DIR [FAMILY:KERNEL[:MODE] ...]``
(default: our Triton kernels of every family; an adapter needs its sources installed).
``summary.json`` is rewritten after every run, so a session cut short keeps the runs it finished;
``--timeout S`` stops one run after S seconds (a fail, its reason said); ``--record FILE`` appends one
``sanitize`` record per run (schema replayssm.record/1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from replayssm.guard import check_record_path
from replayssm.records import Recorder, append

DEFAULT = [f"{fam}:{k}" for fam in ("mamba2", "gdn", "kda") for k in ("triton-replay", "triton-baseline")]
TOOLS = ("initcheck", "memcheck")
DECODES = ("speculative", "standard")
_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


def command(tool: str, family: str, kernel: str, decode: str, out: Path, mode: str | None = None) -> list[str]:
    """The compute-sanitizer command line of one run (``mode``: the precision mode, default validate's)."""
    return ["compute-sanitizer", "--tool", tool, "--target-processes", "all", "--error-exitcode", "99",
            sys.executable, "-m", "replayssm", "validate", "--kernel", kernel, "--family", family, "--decode", decode,
            "--steps", "6", "--device", "cuda", "--no-repeat", "--quiet", *(["--precision", mode] if mode else []),
            "--out", str(out / f"{family}-{kernel}-{decode}-{tool}")]


def errors_of(text: str) -> int | None:
    """The error count of the sanitizer's ``ERROR SUMMARY`` lines (summed over processes), None without one."""
    found = [int(n) for n in _SUMMARY.findall(text)]
    return sum(found) if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", default=DEFAULT, metavar="FAMILY:KERNEL")
    ap.add_argument("--out", default="out/sanitize", help="folder for the validate results and summary.json")
    ap.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds one run may take")
    ap.add_argument("--record", default=None, metavar="FILE", help="append one sanitize record per run")
    args = ap.parse_args(argv)
    if args.timeout is not None and not args.timeout > 0:
        print(f"--timeout: expected seconds > 0, got {args.timeout}", file=sys.stderr)
        return 2
    check_record_path(args.record)
    if shutil.which("compute-sanitizer") is None:
        print("compute-sanitizer: not on PATH (it ships with the CUDA toolkit)", file=sys.stderr)
        return 2
    bad = [t for t in args.targets if t.count(":") not in (1, 2)]
    if bad:
        print(f"targets: expected FAMILY:KERNEL or FAMILY:KERNEL:MODE, got {bad}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    env.pop("TRITON_INTERPRET", None)
    recorder = Recorder("sanitize", device="cuda", source="tools/sanitize.py") if args.record else None
    runs, failed = [], 0
    for target in args.targets:
        family, kernel, mode = (target.split(":") + [None])[:3]
        for decode in DECODES:
            for tool in TOOLS:
                run = one_run(tool, family, kernel, decode, out, env, args.timeout, mode)
                failed += not run["passed"]
                runs.append(run)
                print(f"{'PASS' if run['passed'] else 'FAIL'} {tool:9s} {family}:{kernel} {decode}: "
                      f"exit {run['exit_code']}, {run['errors']} sanitizer error(s)", flush=True)
                (out / "summary.json").write_text(json.dumps({"runs": runs, "failed": failed}, indent=1))
                if recorder is not None:
                    append(args.record, [record_of(recorder, run)])
    return 1 if failed else 0


def one_run(tool: str, family: str, kernel: str, decode: str, out: Path, env: dict, timeout: float | None,
            mode: str | None = None) -> dict:
    """One validate under ``tool``: its exit code, the sanitizer's error count and the verdict."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(command(tool, family, kernel, decode, out, mode), env=env, capture_output=True, text=True,
                           timeout=timeout)
        code, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        text = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        text += f"\nstopped after --timeout {timeout} s"
    n = errors_of(text)
    ok = code == 0 and n == 0
    return {"family": family, "kernel": kernel, "decode": decode, "tool": tool, "mode": mode, "exit_code": code,
            "errors": n,
            "passed": ok, "wall_s": round(time.perf_counter() - t0, 1), "tail": text[-2000:] if not ok else ""}


def record_of(recorder: Recorder, run: dict) -> dict:
    """The ``sanitize`` record of one run (the sanitizer's tail as the reason of a fail)."""
    return recorder.record(f"{run['family']}/{run['kernel']}/{run['decode']}/{run['tool']}", family=run["family"],
                           kernel=run["kernel"], geometry="tiny",
                           metrics={"errors": run["errors"], "exit_code": run["exit_code"], "wall_s": run["wall_s"]},
                           config={"tool": run["tool"], "decode": run["decode"], "steps": 6,
                                   "caching_allocator": False},
                           mode=run.get("mode"),
                           verdict="pass" if run["passed"] else "fail",
                           reason=None if run["passed"] else run["tail"][-500:])


if __name__ == "__main__":
    raise SystemExit(main())
