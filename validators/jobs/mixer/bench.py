"""The time of one mixer step (verify + commit) against the bytes it must move.

Oracle for the bytes: the family's traffic model (``Family.traffic``, docs/recurrences.md sections
2-4; the replay kernel's mean over the cursor cycle of committing ``k`` every step, as the SSM
bench's :func:`validators.jobs.bench.run.step_bytes`) plus what the mixer adds per row: the
norm's gate ``z`` (one token's output size in the activation dtype, per window position) and the
conv window's traffic by the kernel's declared design (:data:`CONV_BYTES`: the committed window
read once, the design's writes at verify and at commit).  The conv-derived SSM inputs are counted
once, as the conv inputs (the same channel count).  The conv and norm weights, shared by every
row, are left out.

Timing: eager steps (the mixer kernels keep host bookkeeping, so no CUDA graph), on CUDA between
``torch.cuda.synchronize()`` calls, the median over repetitions of a whole step; on a CPU the
wall clock of a few steps, whose numbers only show the table's shape (Python and the Triton
interpreter, not memory, bound them).  No configuration is timed before the mixer runner has
judged it (a short :func:`validate_mixer` run at the same family, mode and T').
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from replayssm.families import family
from replayssm.interface import DecodeConfig
from replayssm.mixer.kernel import MixerConfig, MixerKernel, mixer_kernel
from replayssm.mixer.spec import mixer_preset
from replayssm.precision import parse_mode
from replayssm.validators.engine.mixer.runner import MixerPlan, default_plan, make_inputs, make_params
from replayssm.validators.engine.mixer.scenario import MixerScenario, mixer_reason
from replayssm.validators.jobs.bench.run import cursor_cycle, environment, markdown_table

# Conv-state elements per row and channel one step moves (W = d_conv - 1, T = T'): the committed window
# read by the verify, plus each design's writes (and the commit's reads and writes).
CONV_BYTES = {
    "lazy-offset": lambda W, T: W + (W + T - 1),  # the extended window written from column 0
    "compact-at-commit": lambda W, T: W + (W + T - 1) + 2 * W,  # + the commit's move of W columns
    "draft-snapshots": lambda W, T: W + T * W + 2 * W,  # a window per position + the commit's copy
    "circular": lambda W, T: W + T,  # the T new inputs into the ring
}


def mixer_step_bytes(family_name: str, geometry: str, mode, decode: DecodeConfig, k: int, conv_policy: str,
                     d_conv: int = 4) -> float:
    """Modelled bytes per row of one mixer step (see the module docstring)."""
    g = mixer_preset(geometry, family_name, d_conv)
    m = parse_mode(mode)
    a = m.act_bytes_per_element
    ssm = family(family_name).traffic(g.ssm, m).replay_cycle_mean(decode, cursor_cycle(decode, k)[1])
    z = decode.window * a * math.prod(g.out_shape)
    conv = CONV_BYTES[conv_policy](d_conv - 1, decode.window) * g.conv_channels * a
    return ssm + z + conv


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_mixer_step(cls: type[MixerKernel], family_name: str, geometry: str, mode, decode: DecodeConfig, batch: int,
                    k: int, device, reps: int, seed: int = 0) -> list[float]:
    """µs of each of ``reps`` timed steps (verify + commit of ``k`` per row), after two untimed ones."""
    g = mixer_preset(geometry, family_name)
    m = parse_mode(mode)
    kern = cls(MixerConfig(g, make_params(g, m, seed), m, decode, batch, torch.device(device)))
    slots = torch.arange(batch, dtype=torch.int64, device=device)
    kern.reset(slots)
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = {n: t.to(device) for n, t in make_inputs(g, m, batch, decode.window, gen).items()}
    acc = torch.full((batch,), k, dtype=torch.int64, device=device)
    times = []
    for i in range(reps + 2):
        _sync(device)
        t = time.perf_counter()
        kern.verify(slots, inputs)
        kern.commit(slots, acc)
        _sync(device)
        if i >= 2:
            times.append((time.perf_counter() - t) * 1e6)
    return times


def bench_mixer(kernel, family_name: str, geometry: str = "tiny", mode="s32a16", batches=(1, 4), window: int = 4,
                buffer: int | None = None, ks=None, device="cpu", reps: int = 5, log=print) -> dict:
    """Time ``kernel`` per (k, batch): the result dict (``rows``: µs per step, modelled bytes, GB/s)."""
    cls = mixer_kernel(kernel) if isinstance(kernel, str) else kernel
    ks = list(ks or sorted({window, max(1, window // 2)}, reverse=True))
    B = buffer if buffer is not None else (max(16, window) if window > 1 else 16)
    plan = MixerPlan(1, window, B, (((0,), (1,)),))
    g = mixer_preset(geometry, family_name)
    reason = mixer_reason(cls, g, mode, plan)
    if reason:
        raise ValueError(f"--kernel: {cls.name} does not support this run: {reason}")
    if any(not 1 <= k <= window for k in ks):
        raise ValueError(f"--ks: expected accepted counts in [1, {window}], got {ks}")
    check_plan = default_plan(g.d_conv, steps=6, window=window, buffer=B)
    checked = MixerScenario(family_name, str(mode), check_plan, 0, geometry).run(cls, device=device, max_failures=1)
    rows = []
    for k in ks:
        for b in batches:
            samples = time_mixer_step(cls, family_name, geometry, mode, plan.decode, b, k, device, reps)
            us = statistics.median(samples)
            nbytes = mixer_step_bytes(family_name, geometry, mode, plan.decode, k, cls.conv_policy) * b
            rows.append({"k": k, "batch": b, "us": us, "bytes": nbytes, "gbps": nbytes / (us * 1e-6) / 1e9,
                         "samples_us": samples})
            log(f"  {cls.name} {family_name} T'={window} k={k} batch {b}: {us:.1f} us, {nbytes / 1e6:.3f} MB")
    return {"level": "mixer", "kernel": cls.name, "conv_policy": cls.conv_policy, "family": family_name,
            "geometry": geometry, "mode": str(parse_mode(mode).id), "window": window, "buffer": B,
            "device": str(device), "timing": "cuda-sync" if torch.device(device).type == "cuda" else "wall (cpu)",
            "check": checked.verdict(), "checked": checked.passed, "env": environment(), "rows": rows}


def table(res: dict) -> str:
    head = ["k", "batch", "µs / step", "MB / step (model)", "GB/s"]
    return markdown_table(head, [[r["k"], r["batch"], f"{r['us']:.1f}", f"{r['bytes'] / 1e6:.4f}",
                                  f"{r['gbps']:.3f}"] for r in res["rows"]])


def bench_record(recorder, res: dict) -> list[dict]:
    """One record per row of a mixer bench (``replayssm bench --level mixer --record FILE``)."""
    out = []
    for r in res["rows"]:
        out.append(recorder.record(
            f"{res['family']}/{res['kernel']}/{res['mode']}/{res['geometry']}/mixer-bench/T{res['window']}k{r['k']}"
            f"/b{r['batch']}", metrics={"us": r["us"], "bytes": r["bytes"], "gbps": r["gbps"]},
            verdict="none", config={"level": "mixer", "window": res["window"], "buffer": res["buffer"],
                                    "k": r["k"], "batch": r["batch"], "timing": res["timing"],
                                    "conv_policy": res["conv_policy"]},
            family=res["family"], kernel=res["kernel"], mode=res["mode"], geometry=res["geometry"]))
    return out
