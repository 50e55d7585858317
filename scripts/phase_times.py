"""Where a replay step's time goes, on a GPU: each phase of the two-launch replay path timed alone
(CUDA graph of one step over rotated slot sets; the graph pins every slot's cursor before each step),
against the traffic model's bytes of that phase.

Phases: ``nonflush`` (a verify at write_pos 8), ``flush`` (the flush verify), ``coef`` (the
pre-pass alone, non-flush), ``stream`` (the checkpoint stream alone, non-flush).

Usage: python scripts/phase_times.py FAMILY DECODE BATCH '{"num_warps": 2}' [mode]
"""

from __future__ import annotations

import json
import sys

import torch
from split_setup import build_replay, state_bytes

from replayssm.bench import graph_median_ms, num_sets


def main() -> int:
    family, decode, batch, opts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "s32a16"
    dev = "cuda"
    if family == "mamba2":
        from replayssm.ops.mamba2.replay_split import launch_split
    else:
        from replayssm.ops.gdn.replay_split import launch_split
    row_bytes = state_bytes(family)
    nsets = num_sets(batch * row_bytes, dev)
    kern, g, dec, inputs = build_replay(family, decode, batch * nsets, opts, mode, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    sets = []
    for s in range(nsets):
        ids = torch.arange(s * batch, (s + 1) * batch, dtype=torch.int64, device=dev)
        kern.reset(ids, 0.5 * torch.randn((batch, *g.state_shape), generator=gen, device=dev))
        sets.append((ids, inputs(batch, gen),
                     torch.empty((batch, dec.window, *g.out_shape), dtype=torch.bfloat16, device=dev)))
    # fill the ring with plausible records: run a few committed steps first
    acc = torch.full((batch,), dec.window, dtype=torch.int64, device=dev)
    for _ in range(6):
        for ids, inp, out in sets:
            kern.verify(ids, inp, out)
            kern.commit(ids, acc)
    flush_wp = 15 if decode == "standard" else 16

    def pin(wp):
        kern.write_pos.fill_(wp)
        kern.origin.zero_()
        if hasattr(kern, "is_flush"):
            kern.is_flush.fill_(int(dec.is_flush(wp)))

    def step(wp, phases):
        def run():
            for ids, inp, out in sets:
                pin(wp)
                if family == "mamba2":
                    launch_split(kern, ids, inp, out, False, phases)
                else:
                    launch_split(kern, ids, inp, out, phases)
        return run

    res = {"family": family, "decode": decode, "batch": batch, "opts": opts, "mode": mode}
    for name, wp, ph in (("nonflush", 8, "both"), ("flush", flush_wp, "both"), ("coef", 8, "coef"),
                         ("stream", 8, "stream")):
        if ph == "stream":
            step(8, "both")()
        res[name] = graph_median_ms(step(wp, ph), warmup_calls=1, rep_ms=120) * 1e3 / nsets
    res["state_read_tbps_nonflush"] = batch * row_bytes / (res["nonflush"] * 1e-6) / 1e12
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
