"""What scripts/phase_times.py and scripts/profile_split.py share: one "triton-replay" instance of a
family at its benchmark geometry (nano4b / qwen35-4b), with a maker of fresh bf16 inputs."""

from __future__ import annotations

import torch

from replayssm.geometry import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.registry import get


def state_bytes(family: str) -> int:
    """fp32 state bytes of one batch row at the family's benchmark geometry."""
    if family == "mamba2":
        g = preset("nano4b", "mamba2")
        return g.nheads * g.headdim * g.dstate * 4
    g = preset("qwen35-4b", "gdn")
    return g.num_v_heads * g.head_v_dim * g.head_k_dim * 4


def build_replay(family: str, decode: str, slots: int, opts: dict, mode: str = "s32a16", dev: str = "cuda"):
    """(kernel, geometry, decode config, inputs(rows, gen))."""
    dec = DecodeConfig("standard", 1, 16) if decode == "standard" else DecodeConfig("speculative", 4, 16)
    if family == "mamba2":
        from replayssm.bench import _inputs, _params
        g = preset("nano4b", "mamba2")
        params = _params(g, torch.Generator().manual_seed(0), dev)

        def inputs(rows, gen):
            return _inputs(g, rows, dec.window, torch.bfloat16, gen, dev)
    else:
        from replayssm.ops.gdn import bench_cases as gb
        g = preset("qwen35-4b", "gdn")
        params = gb.make_params(g, 0, dev)

        def inputs(rows, gen):
            return gb.make_inputs(g, rows, dec.window, torch.bfloat16, gen, dev)
    kern = get("triton-replay", family)(KernelConfig(g, params, mode, dec, num_slots=slots, device=torch.device(dev),
                                                     options={"checks": False, **opts}))
    return kern, g, dec, inputs
