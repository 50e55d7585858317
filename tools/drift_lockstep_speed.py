"""Validated tokens/s of the drift lock-step on a GPU, its parts, and its ratio to the fp64 floor.

Oracle of the floor: a copy-bandwidth measurement (``dst.copy_(src)``, fp64, ``do_bench`` median):
the fp64 reference must at least read and write its state once per token, ``2 x 8 B x S`` per
token (S = state elements per sequence), so ``floor = bandwidth / (16 S)`` tokens/s.  Oracle of
the rates: wall-clock of ``CellRun.run_steps`` after a warm-up (compiles and graph captures
outside the timed region), synchronised, tokens = accepted tokens of every row.

For each batch: the fast path as ``replayssm drift`` runs it on a GPU (CUDA graphs, fused fp64
reference with the chunk's hoisted terms) and with the eager reference, and the device time of
one fp64 reference step alone (eager, fused, fused with the hoisted terms; ``do_bench``): the
bound the harness cannot beat.

    python tools/drift_lockstep_speed.py --rows 8 64 --tokens 24000 4000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

from replayssm.families import family, preset
from replayssm.validators.jobs.drift.sweep import CellRun, CellSpec, SweepConfig, default_chunk


def floor(geometry: str) -> dict:
    from triton.testing import do_bench
    n = 1 << 27  # 1 GiB of fp64
    src = torch.randn(n, dtype=torch.float64, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=200, return_mode="median")
    bw = 2 * n * 8 / (ms * 1e-3)
    S = 1
    for d in preset(geometry, "mamba2").state_shape:
        S *= d
    return {"copy_bytes_per_s": bw, "state_elements": S, "fp64_floor_tokens_per_s": bw / (16 * S)}


def reference_step_us(geometry: str, rows: int) -> dict:
    """Device time of one fp64 reference token for ``rows`` rows: eager and fused."""
    from triton.testing import do_bench
    fam, g = family("mamba2"), preset(geometry, "mamba2")
    gen = torch.Generator(device="cuda").manual_seed(0)
    tok = {n: torch.randn((rows, *s), generator=gen, device="cuda", dtype=torch.float64)
           for n, s in g.input_shapes().items()}
    params = {n: torch.rand(s, generator=gen, device="cuda", dtype=torch.float64) for n, s in g.param_shapes().items()}
    st = torch.randn((rows, *g.state_shape), generator=gen, device="cuda", dtype=torch.float64)
    prep = fam.reference_prepare(tok, params)
    hoisted = fam.reference_hoist(prep, params)
    out = {}
    for name, f, p in (("eager", fam.reference_advance, prep), ("fused", fam.reference_advance_fused, prep),
                       ("fused_hoisted", fam.reference_advance_fused, hoisted)):
        out[name] = 1e3 * do_bench(lambda f=f, p=p: f(st, p, params), warmup=20, rep=100, return_mode="median")
    y1, s1 = fam.reference_advance(st, prep, params)
    y2, s2 = fam.reference_advance_fused(st, prep, params)
    y3, s3 = fam.reference_advance_fused(st, hoisted, params)
    out["bit_identical"] = bool(torch.equal(y1, y2) and torch.equal(s1, s2) and torch.equal(y1, y3)
                                and torch.equal(s1, s3))
    return out


def rate(kernel: str, geometry: str, rows: int, tokens: int, fused: bool, warm: int) -> dict:
    cfg = SweepConfig(families=("mamba2",), kernels=(kernel,), modes=("s32a16",), schedules=("standard",),
                      geometry=(("mamba2", geometry),), rows=rows, tokens=tokens, local_every=8)
    spec = CellSpec("mamba2", kernel, "s32a16", "long-memory", "standard")
    t0 = time.perf_counter()
    run = CellRun(spec, cfg, "cuda", chunk=default_chunk("cuda", rows), fused=fused)
    run.run_steps(warm)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    steps0 = run.step
    while not run.done:
        run.run_steps(run.chunk)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t1
    n = rows * (run.step - steps0)
    fast = run.fast
    return {"rows": rows, "tokens_per_row": tokens, "fused": fused, "timed_tokens": n, "wall_s": wall,
            "tokens_per_s": n / wall, "setup_and_warmup_s": t1 - t0, "graphs": len(fast.cache),
            "replays": fast.replays, "capture_error": fast.capture_error,
            "result": json.dumps(run.result(), sort_keys=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="triton-replay")
    ap.add_argument("--geometry", default="nano4b")
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--tokens", type=int, nargs="+", default=[24000, 4000], help="per row, one per --rows")
    ap.add_argument("--warm", type=int, default=192, help="steps before the timed region")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("drift_lockstep_speed: needs a CUDA device")
    torch.set_num_threads(1)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, **floor(a.geometry), "batches": []}
    fl = res["fp64_floor_tokens_per_s"]
    print(f"copy {res['copy_bytes_per_s'] / 1e12:.2f} TB/s; fp64 floor {fl:,.0f} tokens/s", flush=True)
    for rows, tokens in zip(a.rows, a.tokens):
        b = {"rows": rows}
        res["batches"].append(b)
        try:  # each measurement on its own: a failure is recorded and the others still run
            ref = reference_step_us(a.geometry, rows)
            ref["floor"] = rows * 16 * res["state_elements"] / res["copy_bytes_per_s"] * 1e6
            b["reference_step_us"] = ref
            print(f"batch {rows}: fp64 reference step {ref['eager']:.1f} us eager, {ref['fused']:.1f} us fused, "
                  f"{ref['fused_hoisted']:.1f} us fused with the hoisted terms (bit-identical {ref['bit_identical']});"
                  f" floor {ref['floor']:.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded in the JSON
            b["reference_step_error"] = traceback.format_exc()[-1500:]
            print(f"batch {rows}: reference step timing failed: {type(e).__name__}: {e}", flush=True)
        for fused in (True, False):
            name = "fused" if fused else "eager"
            try:
                r = rate(a.kernel, a.geometry, rows, tokens if fused else max(a.warm + 64, tokens // 4), fused,
                         a.warm)
            except Exception as e:  # noqa: BLE001 - recorded in the JSON
                b[name + "_error"] = traceback.format_exc()[-1500:]
                print(f"batch {rows} {name} reference: failed: {type(e).__name__}: {e}", flush=True)
                continue
            r["floor_ratio"] = r["tokens_per_s"] / fl
            b[name] = {k: v for k, v in r.items() if k != "result"}
            print(f"batch {rows} {name} reference: {r['timed_tokens']:,} tokens in {r['wall_s']:.2f} s = "
                  f"{r['tokens_per_s']:,.0f} validated tokens/s ({100 * r['floor_ratio']:.1f} % of the floor); "
                  f"graphs {r['graphs']}, replays {r['replays']}, capture error {r['capture_error']}", flush=True)
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
