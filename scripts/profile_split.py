"""Launches of the two-launch replay path for ``ncu`` (eager, no graph): a few verify/commit steps of
one configuration.  Usage: python scripts/profile_split.py FAMILY DECODE BATCH OPTIONS_JSON [MODE]"""

from __future__ import annotations

import json
import sys

import torch

from replayssm.geometry import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.registry import get


def main() -> int:
    family, decode, batch, opts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "s32a16"
    dev = "cuda"
    if family == "mamba2":
        from replayssm.bench import _inputs, _params
        g = preset("nano4b", "mamba2")
        params = _params(g, torch.Generator().manual_seed(0), dev)

        def inputs(gen):
            return _inputs(g, batch, dec.window, torch.bfloat16, gen, dev)
    else:
        from replayssm.ops.gdn import bench_cases as gb
        g = preset("qwen35-4b", "gdn")
        params = gb.make_params(g, 0, dev)

        def inputs(gen):
            return gb.make_inputs(g, batch, dec.window, torch.bfloat16, gen, dev)
    dec = DecodeConfig("standard", 1, 16) if decode == "standard" else DecodeConfig("speculative", 4, 16)
    kern = get("triton-replay", family)(KernelConfig(g, params, mode, dec, num_slots=batch, device=torch.device(dev),
                                                     options={"checks": False, **opts}))
    gen = torch.Generator(device=dev).manual_seed(0)
    ids = torch.arange(batch, dtype=torch.int64, device=dev)
    kern.reset(ids, torch.randn((batch, *g.state_shape), generator=gen, device=dev))
    acc = torch.full((batch,), dec.window, dtype=torch.int64, device=dev)
    out = torch.empty((batch, dec.window, *g.out_shape), dtype=torch.bfloat16, device=dev)
    for _ in range(6):
        kern.verify(ids, inputs(gen), out)
        kern.commit(ids, acc)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
