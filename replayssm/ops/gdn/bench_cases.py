"""Gated DeltaNet benchmark cases (issue 5) in the shared harness of ``replayssm/bench.py``.

Oracle for the numbers: the memory-traffic model of spec sections 3-4 for GDN (baseline ``2 S``
per standard step, replay ``S + R + S/L`` averaged over the L cycle; speculative baseline
``(1 + T') S`` per verify, replay ``S + R (+ S on a flush verify)``) and the copy bandwidth
measured in the same run.  Every timed unit is a CUDA graph of a whole cursor cycle over
rotated slot/input sets (``bench.cursor_cycle``, ``bench.num_sets``), ``do_bench`` median with
L2 cleared between replays; each configuration first runs a full cycle (every flush phase)
against the fp64 recurrence and must stay within 4 units of the mode.

Standard decode: a step is one ``verify`` launch (the cursor advances inside it; ``commit(1)``
launches nothing with checks off).  Speculative: ``verify`` + the device-side ``commit``.

``python -m replayssm.ops.gdn.bench_cases [--quick]`` prints the issue-5 table;
``warm`` compiles every configuration the GPU tests and the benchmark use, in parallel processes
(Triton's on-disk cache then serves the timed run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import torch

from replayssm.bench import BenchRow, copy_bandwidth, cursor_cycle, environment, graph_median_ms, num_sets, table
from replayssm.geometry import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.ops.gdn.naive import gdn_step
from replayssm.precision import parse_mode
from replayssm.registry import get

# Launch configurations tried at every batch size (the fastest is reported with its config).
# First H200 run (docs/benchmarks.md): baselines 8x1 ~ 32x4 (87 % of copy); replay best at 16x2.
BASELINE_CANDIDATES = [{"block_v": 8, "num_warps": 1}, {"block_v": 32, "num_warps": 4}]
STANDARD_REPLAY_CANDIDATES = [{}, {"prepass": False, "block_v": 8, "num_warps": 1},
                              {"prepass": True, "block_v": 16, "num_warps": 1}]
SPEC_BASELINE_CANDIDATES = [{"block_v": 8, "num_warps": 1}, {"block_v": 16, "num_warps": 2}]
SPEC_REPLAY_CANDIDATES = [{}, {"prepass": False, "block_v": 16, "num_warps": 1}]


@dataclass(frozen=True)
class GDNTraffic:
    """Fewest bytes a GDN decode step must move per batch row (each state, record, input and
    output read or written once; key-head records are shared by their value heads)."""

    state: float  # S: one stored state [HV, V, K] (scales included)
    record: float  # one buffered token: d [HV, V], normalised k [H, K] (activation dtype), g [HV] fp32
    inputs: float  # one token's q, k, v, a, b
    output: float  # one token's output o [HV, V]

    @classmethod
    def of(cls, g, mode) -> GDNTraffic:
        m = parse_mode(mode)
        a = m.act_bytes_per_element
        state = g.num_v_heads * g.head_v_dim * g.head_k_dim * m.state_bytes_per_element(g.head_k_dim)
        record = g.num_v_heads * g.head_v_dim * a + g.num_k_heads * g.head_k_dim * a + g.num_v_heads * 4
        inputs = 2 * g.num_k_heads * g.head_k_dim * a + g.num_v_heads * g.head_v_dim * a + 2 * g.num_v_heads * a
        return cls(state, record, inputs, g.num_v_heads * g.head_v_dim * a)

    def baseline_step(self, window: int) -> float:
        """Standard: read + write the state; speculative: read 1 state, write T' draft states."""
        return self.state * (1 + window) + window * (self.inputs + self.output)

    def replay_step(self, decode: DecodeConfig, write_pos: int, flush: bool) -> float:
        T = decode.window
        b = self.state + write_pos * self.record + T * (self.inputs + self.output)
        if decode.speculative:
            return b + T * self.record + (self.state if flush else 0.0)
        return b + (self.state if flush else self.record)

    def replay_cycle_mean(self, decode: DecodeConfig, cycle: list[tuple[int, bool]]) -> float:
        return sum(self.replay_step(decode, wp, fl) for wp, fl in cycle) / len(cycle)


def make_params(g, seed: int = 0, device="cuda") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"A_log": torch.log(0.5 + torch.rand(g.num_v_heads, generator=gen)).to(device),
            "dt_bias": (torch.rand(g.num_v_heads, generator=gen) - 0.5).to(device)}


def make_inputs(g, rows: int, window: int, dtype, gen: torch.Generator, device) -> dict[str, torch.Tensor]:
    return {name: torch.randn((rows, window, *shape), generator=gen, device=device).to(dtype)
            for name, shape in g.input_shapes().items()}


def build(name: str, g, params, mode, decode: DecodeConfig, slots: int, device, options: dict):
    cfg = KernelConfig(g, params, mode, decode, num_slots=slots, device=torch.device(device),
                       options={"checks": False, **options})
    return get(name, "gdn")(cfg)


def fp64_check(kern, g, params, ids, steps: int, k: int, gen) -> float:
    """Run ``steps`` verify/commit(k) steps from a random state beside the fp64 recurrence; returns
    the worst relative L2 output error, and raises if it exceeds 4 units of the mode."""
    dev, R, T = ids.device, ids.shape[0], kern.decode.window
    act = kern.mode.act_dtype
    ref = (0.5 * torch.randn((R, *g.state_shape), generator=gen, device=dev)).double()
    kern.reset(ids, ref.float())
    P = {n: v.double() for n, v in params.items()}
    acc = torch.full((R,), k, dtype=torch.int64, device=dev)
    worst = 0.0
    for _ in range(steps):
        inp = make_inputs(g, R, T, act, gen, dev)
        out = torch.full((R, T, *g.out_shape), float("nan"), dtype=act, device=dev)
        kern.verify(ids, inp, out)
        kern.commit(ids, acc)
        st, new = ref, ref
        for t in range(T):
            y, st = gdn_step(st, *(inp[n][:, t].double() for n in ("q", "k", "v", "a", "b")), P["A_log"],
                             P["dt_bias"])
            worst = max(worst, float((out[:, t].double() - y).norm() / y.norm()))
            if t + 1 == k:
                new = st
        ref = new
    limit = 4 * kern.mode.unit_roundoff
    if not worst <= limit:
        raise AssertionError(f"{kern.name} {kern.config.options}: rel L2 output error {worst:.2e} vs fp64 "
                             f"exceeds {limit:.2e}")
    return worst


def time_kernel(name, g, params, mode, decode, batch, nsets, k, options, device, gen, rep_ms) -> tuple[float, str]:
    """Median µs per step (verify, + commit when speculative) over a full cursor cycle, after an
    fp64 check of the same configuration over a full cycle plus one step."""
    act = parse_mode(mode).act_dtype
    prefix, cycle_steps = cursor_cycle(decode, k)
    steps = len(cycle_steps)
    chk = build(name, g, params, mode, decode, batch, device, options)
    ids0 = torch.arange(batch, dtype=torch.int64, device=device)
    verdict = f"{fp64_check(chk, g, params, ids0, len(prefix) + steps + 1, k, gen):.1e}"
    del chk
    kern = build(name, g, params, mode, decode, batch * nsets, device, options)
    T = decode.window
    acc = torch.full((batch,), k, dtype=torch.int64, device=device)
    sets = []
    for s in range(nsets):
        ids = torch.arange(s * batch, (s + 1) * batch, dtype=torch.int64, device=device)
        kern.reset(ids, 0.5 * torch.randn((batch, *g.state_shape), generator=gen, device=device))
        sets.append((ids, make_inputs(g, batch, T, act, gen, device),
                     torch.empty((batch, T, *g.out_shape), dtype=act, device=device)))

    def one_step(ids, inp, out):
        kern.verify(ids, inp, out)
        kern.commit(ids, acc)

    for _ in prefix:
        for st in sets:
            one_step(*st)

    def cycle():
        for _ in range(steps):
            for st in sets:
                one_step(*st)

    ms = graph_median_ms(cycle, warmup_calls=1, rep_ms=rep_ms)
    return ms * 1e3 / (steps * nsets), verdict


def _best(name, g, params, mode, decode, batch, nsets, k, candidates, device, gen, rep_ms, log):
    best = None
    for opts in candidates:
        us, verdict = time_kernel(name, g, params, mode, decode, batch, nsets, k, opts, device, gen, rep_ms)
        torch.cuda.empty_cache()
        log(f"    {name:16s} {decode.decode:11s} batch {batch:4d} {json.dumps(opts):48s} {us:10.2f} us  fp64 {verdict}")
        if best is None or us < best[0]:
            best = (us, opts, verdict)
    return best


def _row(case, batch, b_us, r_us, b_bytes, r_bytes, copy, nsets, b_opts, r_opts, check) -> BenchRow:
    b_tb = b_bytes / (b_us * 1e-6) / 1e12
    r_tb = r_bytes / (r_us * 1e-6) / 1e12
    return BenchRow(case, batch, b_us, r_us, b_us / r_us, b_tb, r_tb, 100 * b_tb / copy["tbps"],
                    100 * r_tb / copy["tbps"], b_bytes / r_bytes, nsets, b_opts, r_opts, check)


def bench_gdn(geometry="qwen35-4b", mode="s32a16", L=16, batches=(1, 8, 32, 128, 256, 512), spec_batches=(128, 512),
              window=4, spec_buffer=16, device="cuda", rep_ms=150, seed=0, quick=False, log=print) -> dict:
    """The issue-5 table: standard decode (baseline vs replay over a full L cycle) and speculative
    T' = ``window`` (all drafts accepted, half the window accepted) against the per-draft-state
    baseline; each cell is the fastest launch configuration of its candidates."""
    g = preset(geometry, "gdn")
    gen = torch.Generator(device=device).manual_seed(seed)
    params = make_params(g, seed, device)
    copy = copy_bandwidth(device)
    log(f"copy bandwidth: {copy['tbps']:.3f} TB/s ({copy['bytes'] / 2**30:.0f} GiB moved in {copy['ms']:.3f} ms)")
    traffic = GDNTraffic.of(g, mode)
    bsc = BASELINE_CANDIDATES[:1] if quick else BASELINE_CANDIDATES
    rsc = STANDARD_REPLAY_CANDIDATES[:1] if quick else STANDARD_REPLAY_CANDIDATES
    rows: list[BenchRow] = []
    std = DecodeConfig("standard", 1, L)
    base1 = DecodeConfig("standard", 1, 1)
    rb = traffic.replay_cycle_mean(std, cursor_cycle(std, 1)[1])
    bb = traffic.baseline_step(1)
    for batch in batches:
        nsets = num_sets(batch * traffic.state, device)
        b_us, b_opts, b_chk = _best("triton-baseline", g, params, mode, base1, batch, nsets, 1, bsc, device, gen,
                                    rep_ms, log)
        r_us, r_opts, r_chk = _best("triton-replay", g, params, mode, std, batch, nsets, 1, rsc, device, gen,
                                    rep_ms, log)
        row = _row(f"standard L={L}", batch, b_us, r_us, bb * batch, rb * batch, copy, nsets, b_opts, r_opts,
                   f"{b_chk}/{r_chk}")
        rows.append(row)
        log(_line(row))
    dec = DecodeConfig("speculative", window, spec_buffer)
    for label, k in (("all accepted", window), ("half accepted", max(1, window // 2))):
        rb_s = traffic.replay_cycle_mean(dec, cursor_cycle(dec, k)[1])
        bb_s = traffic.baseline_step(window)
        for batch in spec_batches:
            nsets = num_sets(batch * traffic.state, device)
            bc = SPEC_BASELINE_CANDIDATES[:1] if quick else SPEC_BASELINE_CANDIDATES
            rc = SPEC_REPLAY_CANDIDATES[:1] if quick else SPEC_REPLAY_CANDIDATES
            b_us, b_opts, b_chk = _best("triton-baseline", g, params, mode, dec, batch, nsets, k, bc, device, gen,
                                        rep_ms, log)
            r_us, r_opts, r_chk = _best("triton-replay", g, params, mode, dec, batch, nsets, k, rc, device, gen,
                                        rep_ms, log)
            row = _row(f"spec T'={window} B={spec_buffer} {label}", batch, b_us, r_us, bb_s * batch, rb_s * batch,
                       copy, nsets, b_opts, r_opts, f"{b_chk}/{r_chk}")
            rows.append(row)
            log(_line(row))
    phases = []
    if 512 in batches and 512 in spec_batches:
        best = {r.case.split()[0]: r.replay_config for r in rows if r.batch == 512}
        phases = phase_times(g, params, mode, L, window, spec_buffer, best.get("standard", {}),
                             best.get("spec", {}), 512, traffic, copy, device, gen, rep_ms, log)
    return {"family": "gdn", "geometry": geometry, "mode": mode, "L": L, "copy": copy, "env": environment(),
            "rows": [asdict(r) for r in rows], "phases": phases}


def phase_times(g, params, mode, L, window, spec_buffer, std_opts, spec_opts, batch, traffic, copy, device, gen,
                rep_ms, log) -> list[dict]:
    """Where the replay time goes: each phase timed alone (the graph pins every slot's cursor before
    each step, so every replay runs that phase), against the phase's modelled bytes."""
    out = []
    std = DecodeConfig("standard", 1, L)
    spec = DecodeConfig("speculative", window, spec_buffer)
    cases = [("standard non-flush", std, std_opts, L // 2, 0), ("standard flush", std, std_opts, L - 1, 1),
             ("spec non-flush", spec, spec_opts, spec_buffer // 2, 0), ("spec flush", spec, spec_opts, spec_buffer, 1)]
    for label, dec, opts, wp, fl in cases:
        nsets = num_sets(batch * traffic.state, device)
        us = _time_phase(g, params, mode, dec, opts, batch, nsets, wp, fl, device, gen, rep_ms)
        torch.cuda.empty_cache()
        model = batch * traffic.replay_step(dec, wp, bool(fl))
        tb = model / (us * 1e-6) / 1e12
        out.append({"phase": label, "write_pos": wp, "config": opts, "us": us, "model_bytes": model, "tbps": tb,
                    "pct_copy": 100 * tb / copy["tbps"]})
        log(f"  phase {label:20s} write_pos {wp:2d} {json.dumps(opts):40s} {us:9.2f} us  {tb:.2f} TB/s "
            f"({100 * tb / copy['tbps']:.0f}% of copy)")
    return out


def _time_phase(g, params, mode, dec, opts, batch, nsets, wp, fl, device, gen, rep_ms) -> float:
    kern = build("triton-replay", g, params, mode, dec, batch * nsets, device, opts)
    act = kern.mode.act_dtype
    acc = torch.full((batch,), dec.window, dtype=torch.int64, device=device)
    sets = []
    for s in range(nsets):
        ids = torch.arange(s * batch, (s + 1) * batch, dtype=torch.int64, device=device)
        kern.reset(ids, 0.5 * torch.randn((batch, *g.state_shape), generator=gen, device=device))
        sets.append((ids, make_inputs(g, batch, dec.window, act, gen, device),
                     torch.empty((batch, dec.window, *g.out_shape), dtype=act, device=device)))

    def one_phase():
        for ids, inp, o in sets:
            kern.write_pos.fill_(wp)
            kern.is_flush.fill_(fl)
            kern.verify(ids, inp, o)
            kern.commit(ids, acc)

    return graph_median_ms(one_phase, warmup_calls=1, rep_ms=rep_ms) * 1e3 / nsets


def profile(batch: int = 128, device="cuda") -> None:
    """Launches for ``ncu`` (default launch shapes): one baseline step, a full standard L = 16 cycle
    (15 non-flush steps and the flush), a speculative cycle with every draft accepted (3 non-flush
    verifies and the flush)."""
    g = preset("qwen35-4b", "gdn")
    params = make_params(g, 0, device)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.arange(batch, dtype=torch.int64, device=device)
    for name, dec, k in (("triton-baseline", DecodeConfig("standard", 1, 1), 1),
                         ("triton-replay", DecodeConfig("standard", 1, 16), 1),
                         ("triton-replay", DecodeConfig("speculative", 4, 16), 4)):
        kern = build(name, g, params, "s32a16", dec, batch, device, {})
        kern.reset(ids, torch.randn((batch, *g.state_shape), generator=gen, device=device))
        out = torch.empty((batch, dec.window, *g.out_shape), dtype=torch.bfloat16, device=device)
        acc = torch.full((batch,), k, dtype=torch.int64, device=device)
        for _ in range(1 if name == "triton-baseline" else 16 if not dec.speculative else 5):
            kern.verify(ids, make_inputs(g, batch, dec.window, torch.bfloat16, gen, device), out)
            kern.commit(ids, acc)
        torch.cuda.synchronize()
        del kern


def _line(r: BenchRow) -> str:
    return (f"{r.case:34s} batch {r.batch:4d}: baseline {r.baseline_us:9.2f} us ({r.baseline_tbps:.2f} TB/s, "
            f"{r.baseline_pct_copy:.0f}%)  replay {r.replay_us:9.2f} us ({r.replay_tbps:.2f} TB/s, "
            f"{r.replay_pct_copy:.0f}%)  ratio {r.ratio:.2f} (model {r.model_limit:.2f})  sets {r.sets}  "
            f"cfg {r.baseline_config}/{r.replay_config}  fp64 {r.check}")


# ---- parallel compilation ------------------------------------------------------------------------------


def bench_configs(geometry="qwen35-4b", mode="s32a16", L=16, window=4, spec_buffer=16, quick=False):
    """(kernel, geometry, mode, decode, options) of every configuration :func:`bench_gdn` launches."""
    std, base1 = ("standard", 1, L), ("standard", 1, 1)
    spec = ("speculative", window, spec_buffer)
    bsc = BASELINE_CANDIDATES[:1] if quick else BASELINE_CANDIDATES
    rsc = STANDARD_REPLAY_CANDIDATES[:1] if quick else STANDARD_REPLAY_CANDIDATES
    bc = SPEC_BASELINE_CANDIDATES[:1] if quick else SPEC_BASELINE_CANDIDATES
    rc = SPEC_REPLAY_CANDIDATES[:1] if quick else SPEC_REPLAY_CANDIDATES
    out = [("triton-baseline", geometry, mode, base1, o) for o in bsc]
    out += [("triton-replay", geometry, mode, std, o) for o in rsc]
    out += [("triton-baseline", geometry, mode, spec, o) for o in bc]
    out += [("triton-replay", geometry, mode, spec, o) for o in rc]
    return out


def compile_config(cfg) -> str:
    """Compile one configuration by running reset/verify/commit once on 2 rows (the launch
    parameters come from the options, so the cached binaries are the ones the timed run uses)."""
    name, geometry, mode, decode, options = cfg
    t0 = time.perf_counter()
    g = preset(geometry, "gdn") if isinstance(geometry, str) else geometry
    dec = DecodeConfig(*decode)
    kern = build(name, g, make_params(g), mode, dec, 2, "cuda", dict(options))
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.arange(2, dtype=torch.int64, device="cuda")
    kern.reset(ids, torch.randn((2, *g.state_shape), generator=gen, device="cuda"))
    out = torch.empty((2, dec.window, *g.out_shape), dtype=kern.mode.act_dtype, device="cuda")
    kern.verify(ids, make_inputs(g, 2, dec.window, kern.mode.act_dtype, gen, "cuda"), out)
    kern.commit(ids, torch.ones(2, dtype=torch.int64, device="cuda"))
    torch.cuda.synchronize()
    return f"{name} {mode} {decode} {options}: {time.perf_counter() - t0:.1f} s"


def warm(configs, workers: int) -> None:
    """Compile ``configs`` in ``workers`` processes sharing Triton's on-disk cache."""
    import multiprocessing as mp
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for line in ex.map(compile_config, configs):
            print("  compiled", line, flush=True)
    print(f"compiled {len(configs)} configurations in {time.perf_counter() - t0:.1f} s", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m replayssm.ops.gdn.bench_cases")
    p.add_argument("command", nargs="?", default="bench", choices=["bench", "warm", "profile"])
    p.add_argument("--quick", action="store_true", help="one launch configuration per kernel")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--rep-ms", type=float, default=150)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cases: no CUDA device visible; the GDN benchmark needs an NVIDIA GPU")
        return 2
    if args.command == "warm":
        warm(bench_configs(quick=args.quick), args.workers)
        return 0
    if args.command == "profile":
        profile()
        return 0
    res = bench_gdn(quick=args.quick, rep_ms=args.rep_ms)
    e = res["env"]
    print(f"\n{e.get('gpu')}  torch {e['torch']}  triton {e['triton']}  commit {e.get('commit')}"
          f"{' (dirty)' if e.get('dirty') else ''}  {e['date']}  copy {res['copy']['tbps']:.3f} TB/s")
    print(table(res))
    for ph in res["phases"]:
        print(f"phase {ph['phase']:20s} batch 512: {ph['us']:9.2f} us, {ph['tbps']:.2f} TB/s "
              f"({ph['pct_copy']:.0f}% of copy)  {ph['config']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
