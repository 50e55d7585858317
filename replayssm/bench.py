"""GPU benchmark harness (``replayssm bench``): kernel time, achieved bandwidth and the traffic model.

Oracle for the numbers: the memory-traffic model of spec section 3 (baseline ``2 S`` per
standard step, replay ``S + R + S/L``; speculative baseline ``(1 + T') S`` per verify) and the
device's own copy bandwidth, measured in the same run with a preallocated ``dst.copy_(src)``
(bytes read + written over the ``do_bench`` median).  Expected: a memory-bound kernel reaches
75-95 % of the copy bandwidth; the speedup limit of replay over baseline is the ratio of their
modelled bytes.

Method (device/METHOD.md): every timed unit is a CUDA graph of a whole cursor cycle (standard
decode: L steps, so each flush is counted once per L steps; speculative: the steady-state cycle
of the acceptance schedule) over several input/state sets rotated so that what one step reads
is not left in L2 by the step before (enough sets for 4x the L2 size); ``triton.testing.do_bench``
median with warm-up, L2 cleared between replays.  Fresh random non-zero inputs and states.
Before timing, each benchmarked kernel instance runs a cycle against the fp64 recurrence (a
broken configuration cannot win a sweep).

Reusable pieces for any family: :func:`copy_bandwidth`, :func:`graph_median_ms`, :func:`num_sets`,
:func:`cursor_cycle`, :func:`markdown_table`.  The Mamba-2 suite is :func:`bench_mamba2`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field

import torch

from replayssm.geometry import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.precision import parse_mode
from replayssm.registry import get

# ---- generic harness ----------------------------------------------------------------------------------


def _do_bench(fn, rep_ms: float) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median"))


def copy_bandwidth(device="cuda", nbytes: int = 4 << 30, rep_ms: float = 400) -> dict:
    """Device copy bandwidth: a preallocated ``dst.copy_(src)`` of ``nbytes``, bytes read + written
    over the do_bench median (destination allocated outside the timed region)."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _do_bench(lambda: dst.copy_(src), rep_ms)
    return {"bytes": 2 * nbytes, "ms": ms, "tbps": 2 * nbytes / (ms * 1e-3) / 1e12}


def graph_median_ms(fn, *, warmup_calls: int = 2, rep_ms: float = 300) -> float:
    """Median time of one call of ``fn`` replayed from a CUDA graph (``fn`` is run eagerly
    ``warmup_calls`` times first: compilation, autotuning, allocator warm-up)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    ms = _do_bench(graph.replay, rep_ms)
    del graph
    return ms


def num_sets(bytes_per_set: float, device="cuda", l2_multiple: float = 4.0, min_sets: int = 2,
             max_sets: int = 64) -> int:
    """How many input/state sets to rotate so one cycle touches ``l2_multiple`` x the L2 size."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if torch.cuda.is_available() else 50 << 20
    return int(min(max_sets, max(min_sets, math.ceil(l2_multiple * l2 / max(bytes_per_set, 1.0)))))


def cursor_cycle(decode: DecodeConfig, k: int) -> tuple[list[int], list[tuple[int, bool]]]:
    """Cursor path of one slot committing ``k`` every step from reset: (prefix write_pos list,
    steady cycle of (write_pos, flush)).  Replaying the cycle returns the cursor to its start."""
    wp, origin, seen, path = 0, 0, {}, []
    while wp not in seen:
        seen[wp] = len(path)
        flush = decode.is_flush(wp)
        path.append((wp, flush))
        wp, origin = decode.commit_cursor(wp, origin, flush, k)
    start = seen[wp]
    return [w for w, _ in path[:start]], path[start:]


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def environment() -> dict:
    import triton
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sms=p.multi_processor_count, l2_mb=p.L2_cache_size / 2**20,
                   memory_gb=round(p.total_memory / 1e9, 1))
    if os.environ.get("REPLAYSSM_COMMIT"):  # a copy without (or with a stale) .git: the caller names the commit
        env["commit"] = os.environ["REPLAYSSM_COMMIT"]
        return env
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                       check=True).stdout.strip()
        env["dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                           capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        env["commit"] = "unknown"
    return env


# ---- Mamba-2 traffic model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mamba2Traffic:
    """Fewest bytes a Mamba-2 decode step must move per batch row (spec 3-4): each state,
    record, input and output read or written once."""

    state: float  # S: one stored state (scales included)
    record: float  # one buffered token: x, B (activation dtype), Δ (fp32)
    inputs: float  # one token's inputs: x, dt, B, C (z)
    output: float  # one token's output y

    @classmethod
    def of(cls, geometry, mode) -> Mamba2Traffic:
        g, m = geometry, parse_mode(mode)
        a = m.act_bytes_per_element
        state = g.nheads * g.headdim * g.dstate * m.state_bytes_per_element(g.dstate)
        record = g.nheads * g.headdim * a + g.ngroups * g.dstate * a + g.nheads * 4
        inputs = g.nheads * g.headdim * a + g.nheads * a + 2 * g.ngroups * g.dstate * a
        if g.has_z:
            inputs += g.nheads * g.headdim * a
        return cls(state, record, inputs, g.nheads * g.headdim * a)

    def baseline_step(self, window: int) -> float:
        """Standard (T' = 1): read + write the state; speculative: read 1, write T' states."""
        return self.state * (1 + window) + window * (self.inputs + self.output)

    def replay_step(self, decode: DecodeConfig, write_pos: int, flush: bool) -> float:
        T = decode.window
        b = self.state + write_pos * self.record + T * (self.inputs + self.output)
        if decode.speculative:
            return b + T * self.record + (self.state if flush else 0.0)
        return b + (self.state if flush else self.record)

    def replay_cycle_mean(self, decode: DecodeConfig, cycle: list[tuple[int, bool]]) -> float:
        return sum(self.replay_step(decode, wp, fl) for wp, fl in cycle) / len(cycle)


# ---- Mamba-2 benchmark ------------------------------------------------------------------------------------


@dataclass
class BenchRow:
    case: str
    batch: int
    baseline_us: float
    replay_us: float
    ratio: float
    baseline_tbps: float
    replay_tbps: float
    baseline_pct_copy: float
    replay_pct_copy: float
    model_limit: float
    sets: int
    baseline_config: dict = field(default_factory=dict)
    replay_config: dict = field(default_factory=dict)
    check: str = ""


def _params(g, gen, device):
    return {"A": (-1.0 - torch.rand(g.nheads, generator=gen)).to(device),
            "dt_bias": (torch.rand(g.nheads, generator=gen) - 0.5).to(device),
            "D": torch.rand(g.nheads, generator=gen).to(device)}


def _inputs(g, rows, window, dtype, gen, device):
    out = {}
    for name, shape in g.input_shapes().items():
        t = torch.randn((rows, window, *shape), generator=gen, device=device)
        if name == "dt":
            t = t - 2.0
        out[name] = t.to(dtype)
    return out


def _fp64_check(kernel, g, params, ids, inputs_seq, ks, mode) -> str:
    """Run ``inputs_seq`` through ``kernel`` (reset from a random state) beside the fp64 recurrence;
    returns a short verdict and raises if the outputs are off by more than 4 units of the mode."""
    from replayssm.ops.mamba2.naive import mamba2_step
    dev = ids.device
    R = ids.shape[0]
    init = 0.5 * torch.randn((R, *g.state_shape), device=dev, dtype=torch.float64)
    kernel.reset(ids, init.float())
    ref = kernel.committed_state(ids) if hasattr(kernel, "committed_state") else init
    P = {k: v.double() for k, v in params.items()}
    worst = 0.0
    for inp, k in zip(inputs_seq, ks):
        out = torch.full((R, inp["x"].shape[1], *g.out_shape), float("nan"), dtype=inp["x"].dtype, device=dev)
        kernel.launch_verify(ids, inp, out)
        st, new = ref, ref
        for t in range(inp["x"].shape[1]):
            y, st = mamba2_step(st, inp["x"][:, t].double(), inp["dt"][:, t].double(), inp["B"][:, t].double(),
                                inp["C"][:, t].double(), P["A"], P["dt_bias"], P["D"])
            worst = max(worst, float((out[:, t].double() - y).norm() / y.norm()))
            if t + 1 == k:
                new = st
        kernel.launch_commit(ids, torch.full((R,), k, dtype=torch.int64, device=dev))
        ref = new
    limit = 4 * parse_mode(mode).unit_roundoff + 1e-6
    if not worst <= limit:
        raise AssertionError(f"{kernel.name} {kernel.config.options}: rel L2 output error {worst:.2e} vs fp64 "
                             f"exceeds {limit:.2e}")
    return f"{worst:.1e}"


def _build(name, g, params, mode, decode, slots, device, options):
    cfg = KernelConfig(g, params, mode, decode, num_slots=slots, device=device,
                       options={"checks": False, **options})
    return get(name, "mamba2")(cfg)


def _time_kernel(name, g, params, mode, decode, batch, nsets, ks_prefix, cycle_k, options, device, gen,
                 rep_ms, fused_standard: bool) -> tuple[float, str]:
    """Median µs per verify(+commit) step of kernel ``name`` over a full cursor cycle."""
    act = parse_mode(mode).act_dtype
    k = _build(name, g, params, mode, decode, batch * nsets, device, options)
    T = decode.window
    sets = []
    for s in range(nsets):
        ids = torch.arange(s * batch, (s + 1) * batch, dtype=torch.int64, device=device)
        inp = _inputs(g, batch, T, act, gen, device)
        out = torch.empty((batch, T, *g.out_shape), dtype=act, device=device)
        sets.append((ids, inp, out))
    acc = torch.full((batch,), cycle_k, dtype=torch.int64, device=device)
    steps = len(cursor_cycle(decode, cycle_k)[1])
    # a whole cycle (every flush phase) plus one step, against fp64
    check_inputs = [_inputs(g, batch, T, act, gen, device) for _ in range(len(ks_prefix) + steps + 1)]
    verdict = _fp64_check(k, g, params, sets[0][0], check_inputs, [cycle_k] * len(check_inputs), mode)
    for ids, _, _ in sets:
        k.reset(ids, 0.5 * torch.randn((batch, *g.state_shape), generator=gen, device=device))

    def one_step(ids, inp, out):
        if fused_standard:
            k.launch_step(ids, inp, out)
        else:
            k.launch_verify(ids, inp, out)
            k.launch_commit(ids, acc)

    for _ in ks_prefix:
        for ids, inp, out in sets:
            one_step(ids, inp, out)

    def cycle():
        for _ in range(steps):
            for ids, inp, out in sets:
                one_step(ids, inp, out)

    ms = graph_median_ms(cycle, warmup_calls=1, rep_ms=rep_ms) if device_is_cuda(device) else wall_ms(cycle)
    return ms * 1e3 / (steps * nsets), verdict


def device_is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def wall_ms(fn) -> float:
    """CPU stand-in for :func:`graph_median_ms` (the interpreter smoke test of this harness)."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def _best(name, g, params, mode, decode, batch, nsets, prefix, k, candidates, device, gen, rep_ms, fused):
    best = None
    for opts in candidates:
        us, verdict = _time_kernel(name, g, params, mode, decode, batch, nsets, prefix, k, opts, device, gen, rep_ms,
                                   fused)
        if device_is_cuda(device):
            torch.cuda.empty_cache()  # the kernel instance and its sets are gone with _time_kernel's frame
        if best is None or us < best[0]:
            best = (us, opts, verdict)
    return best


# Launch configurations swept per batch (the first is the default: the pre-pass path from 16 rows up,
# the single fused kernel below); each is checked against fp64 over a whole cursor cycle before it is timed.
REPLAY_CANDIDATES = [{}, {"prepass": False}, {"prepass": True}]
SPEC_CANDIDATES = [{}, {"prepass": False}]
BASELINE_CANDIDATES = [{"block_p": 16, "num_warps": 4}, {"block_p": 32, "num_warps": 4}]


def bench_mamba2(geometry="nano4b", mode="s32a16", L=16, batches=(1, 8, 32, 128, 256, 512), spec_batches=(128, 512),
                 window=4, spec_buffer=16, device="cuda", rep_ms=200, sweep=True, seed=0,
                 copy=None, max_sets=64, log=print) -> dict:
    """The issue-4 table: standard decode (baseline vs replay over a full L cycle) and speculative
    T' = ``window`` (all drafts accepted, half accepted) against the per-draft-state baseline."""
    g = preset(geometry, "mamba2")
    gen = torch.Generator(device=device).manual_seed(seed)
    params = _params(g, torch.Generator().manual_seed(seed), device)
    if copy is None:
        copy = copy_bandwidth(device)
        torch.cuda.empty_cache()
    log(f"copy bandwidth: {copy['tbps']:.3f} TB/s ({copy['bytes'] / 2**30:.0f} GiB moved in {copy['ms']:.3f} ms)")
    traffic = Mamba2Traffic.of(g, mode)
    rc = REPLAY_CANDIDATES if sweep else REPLAY_CANDIDATES[:1]
    bc = BASELINE_CANDIDATES if sweep else BASELINE_CANDIDATES[:1]
    sc = SPEC_CANDIDATES if sweep else SPEC_CANDIDATES[:1]
    rows: list[BenchRow] = []
    std = DecodeConfig("standard", 1, L)
    base1 = DecodeConfig("standard", 1, 1)
    prefix, cyc = cursor_cycle(std, 1)
    rb = traffic.replay_cycle_mean(std, cyc)
    bb = traffic.baseline_step(1)
    for batch in batches:
        nsets = num_sets(batch * traffic.state, device, max_sets=max_sets)
        b_us, b_opts, b_chk = _best("triton-baseline", g, params, mode, base1, batch, nsets, [], 1, bc, device, gen,
                                    rep_ms, False)
        r_us, r_opts, r_chk = _best("triton-replay", g, params, mode, std, batch, nsets, prefix, 1, rc, device, gen,
                                    rep_ms, True)
        row = _row(f"standard L={L}", batch, b_us, r_us, bb * batch, rb * batch, copy, nsets, b_opts, r_opts,
                   f"{b_chk}/{r_chk}")
        rows.append(row)
        log(_row_line(row))
    for label, k in (("all accepted", window), ("half accepted", max(1, window // 2))):
        dec = DecodeConfig("speculative", window, spec_buffer)
        prefix, cyc = cursor_cycle(dec, k)
        rb_s = traffic.replay_cycle_mean(dec, cyc)
        bb_s = traffic.baseline_step(window)
        for batch in spec_batches:
            nsets = num_sets(batch * traffic.state, device, max_sets=max_sets)
            b_us, b_opts, b_chk = _best("triton-baseline", g, params, mode, dec, batch, nsets, [], k, bc[:1], device,
                                        gen, rep_ms, False)
            r_us, r_opts, r_chk = _best("triton-replay", g, params, mode, dec, batch, nsets, prefix, k, sc, device,
                                        gen, rep_ms, False)
            row = _row(f"spec T'={window} B={spec_buffer} {label}", batch, b_us, r_us, bb_s * batch, rb_s * batch,
                       copy, nsets, b_opts, r_opts, f"{b_chk}/{r_chk}")
            rows.append(row)
            log(_row_line(row))
    return {"geometry": geometry, "mode": mode, "L": L, "copy": copy, "env": environment(),
            "rows": [asdict(r) for r in rows]}


def _row(case, batch, b_us, r_us, b_bytes, r_bytes, copy, nsets, b_opts, r_opts, check) -> BenchRow:
    b_tb = b_bytes / (b_us * 1e-6) / 1e12
    r_tb = r_bytes / (r_us * 1e-6) / 1e12
    return BenchRow(case, batch, b_us, r_us, b_us / r_us, b_tb, r_tb, 100 * b_tb / copy["tbps"],
                    100 * r_tb / copy["tbps"], b_bytes / r_bytes, nsets, b_opts, r_opts, check)


def _row_line(r: BenchRow) -> str:
    return (f"{r.case:34s} batch {r.batch:4d}: baseline {r.baseline_us:9.2f} us ({r.baseline_tbps:.2f} TB/s, "
            f"{r.baseline_pct_copy:.0f}%)  replay {r.replay_us:9.2f} us ({r.replay_tbps:.2f} TB/s, "
            f"{r.replay_pct_copy:.0f}%)  ratio {r.ratio:.2f} (model {r.model_limit:.2f})  sets {r.sets}  "
            f"cfg {r.baseline_config}/{r.replay_config}  fp64 {r.check}")


HEADERS = ["case", "batch", "baseline µs", "replay µs", "ratio", "baseline TB/s (% copy)", "replay TB/s (% copy)",
           "model limit"]


def table(result: dict) -> str:
    rows = [[r["case"], r["batch"], r["baseline_us"], r["replay_us"], r["ratio"],
             f"{r['baseline_tbps']:.2f} ({r['baseline_pct_copy']:.0f}%)",
             f"{r['replay_tbps']:.2f} ({r['replay_pct_copy']:.0f}%)", r["model_limit"]] for r in result["rows"]]
    return markdown_table(HEADERS, rows)


# ---- command line -------------------------------------------------------------------------------------------


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="time kernels on a CUDA GPU against the copy bandwidth and the "
                                            "traffic model (Mamba-2 and GDN suites of issues 4-5)")
    p.add_argument("--family", default="mamba2", choices=["mamba2", "gdn"])
    p.add_argument("--geometry", default=None, help="preset (default: nano4b for mamba2, qwen35-4b for gdn)")
    p.add_argument("--precision", default="s32a16")
    p.add_argument("--buffer", type=int, default=16, help="L (standard decode)")
    p.add_argument("--batches", default="1,8,32,128,256,512")
    p.add_argument("--spec-batches", default="128,512")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--no-sweep", action="store_true", help="time only the default launch configuration")
    p.add_argument("--rep-ms", type=float, default=200)
    p.add_argument("--json", default=None, help="write the full result here")
    return p


def run(args) -> int:
    if not torch.cuda.is_available():
        print("replayssm bench: no CUDA device visible; the benchmark needs an NVIDIA GPU")
        return 2
    batches = [int(b) for b in args.batches.split(",") if b]
    spec_batches = [int(b) for b in args.spec_batches.split(",") if b]
    if args.family == "gdn":
        from replayssm.ops.gdn.bench_cases import bench_gdn
        res = bench_gdn(args.geometry or "qwen35-4b", args.precision, args.buffer, batches, spec_batches, args.window,
                        rep_ms=args.rep_ms, quick=args.no_sweep)
    else:
        res = bench_mamba2(args.geometry or "nano4b", args.precision, args.buffer, batches, spec_batches,
                           args.window, rep_ms=args.rep_ms, sweep=not args.no_sweep)
    print()
    e = res["env"]
    print(f"{e.get('gpu')}  torch {e['torch']}  triton {e['triton']}  commit {e.get('commit')}"
          f"{' (dirty)' if e.get('dirty') else ''}  {e['date']}  copy {res['copy']['tbps']:.3f} TB/s")
    print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="replayssm bench")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["bench", *(argv or [])])
    return run(args)


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
