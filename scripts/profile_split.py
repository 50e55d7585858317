"""Launches of the two-launch replay path for ``ncu`` (eager, no graph): a few verify/commit steps of
one configuration.  Usage: python scripts/profile_split.py FAMILY DECODE BATCH OPTIONS_JSON [MODE]"""

from __future__ import annotations

import json
import sys

import torch
from split_setup import build_replay


def main() -> int:
    family, decode, batch, opts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "s32a16"
    dev = "cuda"
    kern, g, dec, inputs = build_replay(family, decode, batch, opts, mode, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    ids = torch.arange(batch, dtype=torch.int64, device=dev)
    kern.reset(ids, torch.randn((batch, *g.state_shape), generator=gen, device=dev))
    acc = torch.full((batch,), dec.window, dtype=torch.int64, device=dev)
    out = torch.empty((batch, dec.window, *g.out_shape), dtype=torch.bfloat16, device=dev)
    for _ in range(6):
        kern.verify(ids, inputs(batch, gen), out)
        kern.commit(ids, acc)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
