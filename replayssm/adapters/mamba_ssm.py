"""The mamba_ssm source: ``mamba_ssm/ops/triton/selective_state_update.py`` (mamba-ssm 2.3.2.post1)
as a Mamba-2 baseline, ``mamba-ssm-baseline`` (family mamba2).

Where from: an installed ``mamba_ssm`` (``MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-deps
--no-build-isolation mamba-ssm==2.3.2.post1``) or an unpacked sdist (``REPLAYSSM_MAMBA_SSM_SRC=PATH``,
the folder holding ``PKG-INFO`` and ``mamba_ssm/``).  The package ``__init__`` imports its CUDA
extensions, so only the Triton file is imported, under its own name, through plain package objects
over the tree's folders (its ``from mamba_ssm.ops.triton.softplus import softplus`` loads the real
file; nothing is copied); it needs ``einops``.

Oracle: the validation engine against ``literal-baseline``.  Expected: the literal model's error
within its small factor (or the fp64 running-error bound).

Bridges (besides the poisoned output scratch of ``_base.py``): one token per call and one state per
``state_batch_indices`` row, padding rows ``-1`` (the kernel writes zeros into their outputs).
Standard decode updates the slot's state in place.  Speculative decode keeps draft states in the
adapter, as a serving engine without an intermediate-state buffer must: one state block per draft
position (block ``1 + slot T' + t``); token t runs in place on block t after the previous state is
copied into it; commit(k) makes draft block k - 1 live (the accepted count includes the bonus
token).  ``A``, ``dt``, ``dt_bias`` and ``D`` are stride-0 ``[H, P, N]`` / ``[.., H, P]`` views.

Modes: state in the state tensor's dtype (fp32 / bf16 / fp16, a plain cast), fp32 / bf16 / fp16
activations, fp32 arithmetic, no dots; its ``softplus`` is ``log(exp(x) + 1)`` under Triton 3.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

from replayssm.adapters._base import SlotAdapter, broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._vllm_source import launch_guard
from replayssm.interface import KernelSnapshot
from replayssm.registry import register

NAME = "mamba_ssm"
VERSION = "2.3.2.post1"
ENV = "REPLAYSSM_MAMBA_SSM_SRC"
FILE = Path("mamba_ssm", "ops", "triton", "selective_state_update.py")
HOW = (f"set {ENV}=PATH to its unpacked sdist (pip download --no-deps --no-binary :all: --no-build-isolation "
       f"mamba-ssm=={VERSION}, then tar xzf), or MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-deps "
       f"--no-build-isolation mamba-ssm=={VERSION} where it builds")
MODULE = "mamba_ssm.ops.triton.selective_state_update"

_LOADED: dict[str, types.ModuleType] = {}


def find_root() -> tuple[Path, str]:
    """(the folder holding ``mamba_ssm/``, its version); ``RuntimeError`` (one line) if none fits."""
    path = os.environ.get(ENV)
    if path:
        root = Path(path)
        if not (root / FILE).is_file():
            raise RuntimeError(f"mamba_ssm: {ENV}={path} has no {FILE}; {HOW}")
        info = root / "PKG-INFO"
        have = next((ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
                     if ln.startswith("Version:")), "unknown") if info.is_file() else "unknown"
    else:
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"mamba_ssm: package not installed and {ENV} not set; {HOW}")
        from importlib import metadata
        root = Path(list(spec.submodule_search_locations)[0]).parent
        try:
            have = metadata.version("mamba_ssm")
        except metadata.PackageNotFoundError:
            have = "unknown"
    if have != VERSION:
        raise RuntimeError(f"mamba_ssm {have} at {root}: the adapter reads mamba-ssm {VERSION}; {HOW}")
    if importlib.util.find_spec("einops") is None:
        raise RuntimeError("mamba_ssm: its Triton file imports einops (pip install einops)")
    return root, have


def kernel_module() -> types.ModuleType:
    """The Triton file's module, imported on first use from :func:`find_root`'s tree."""
    if "ssu" not in _LOADED:
        root, _ = find_root()
        if "mamba_ssm" not in sys.modules or not hasattr(sys.modules["mamba_ssm"], "__path__"):
            for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
                mod = types.ModuleType(name)
                mod.__path__ = [str(root / Path(*name.split(".")))]
                sys.modules[name] = mod
        try:
            _LOADED["ssu"] = importlib.import_module(MODULE)
        except Exception as e:
            raise RuntimeError(f"mamba_ssm: importing {MODULE} from {root} failed ({type(e).__name__}: {e})") from None
    return _LOADED["ssu"]


class MambaSSMBaseline(SlotAdapter):
    name = "mamba-ssm-baseline"
    family = "mamba2"
    kind = "baseline"
    description = ("mamba_ssm 2.3.2.post1 selective_state_update (Triton; Mamba-2 baseline; speculative: "
                   "draft states kept by the adapter)")

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "mamba_ssm's selective_state_update")

    def __init__(self, config):
        super().__init__(config)
        self.fn = kernel_module().selective_state_update
        g = self.geometry
        self.T = self.decode.window if self.decode.speculative else 1
        self.states = torch.zeros((1 + self.num_slots * self.T, *self.state_shape), dtype=self.mode.state_dtype,
                                  device=self.device)
        self.live = torch.ones(self.num_slots, dtype=torch.long)  # accepted count (host)
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        tied = tie_hdim(p, g)
        self.A3, self.bias2, self.D2 = tied["A"], tied["dt_bias"], tied["D"]

    def block(self, s: int, t: int) -> int:
        return 1 + s * self.T + t

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        for r, s in enumerate(ids):
            if s >= 0:
                self.states[self.block(s, 0)] = 0 if initial_state is None else initial_state[r].to(self.states.dtype)
                self.live[s] = 1
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        g = self.geometry
        act = self.active_rows(slot_ids)
        for t in range(self.T):
            idx = []
            for s in ids:
                if s < 0:
                    idx.append(-1)
                    continue
                src = self.block(s, int(self.live[s]) - 1) if t == 0 else self.block(s, t - 1)
                if src != self.block(s, t):
                    self.states[self.block(s, t)] = self.states[src]
                idx.append(self.block(s, t))
            tok = {k: v[:, t].contiguous() for k, v in inputs.items()}
            dt = broadcast_last(tok["dt"], g.headdim)
            with launch_guard(self.device):
                o = self.fn(self.states, tok["x"], dt, self.A3, tok["B"], tok["C"], D=self.D2, z=tok.get("z"),
                            dt_bias=self.bias2, dt_softplus=True,
                            state_batch_indices=torch.tensor(idx, dtype=torch.int32, device=self.device))
            out[act, t] = o.index_select(0, act).to(out.dtype)
        self.end_verify(ids)
        return out

    def commit(self, slot_ids, accepted):
        ids, ks = self.begin_commit(slot_ids, accepted)
        if self.decode.speculative:
            for s, k in zip(ids, ks):
                if s >= 0:
                    self.live[s] = k

    def _live(self, s: int) -> torch.Tensor:
        return self.states[self.block(s, int(self.live[s]) - 1)]

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self._live(s).double())

    def committed_state(self, slot_ids):
        return self.checkpoint_state(slot_ids)

    def snapshot(self):
        n = self.num_slots
        return KernelSnapshot(
            checkpoint=torch.stack([self._live(s) for s in range(n)]).cpu().clone(), checkpoint_scale=None,
            records={}, write_pos=torch.zeros(n, dtype=torch.int64), origin=torch.zeros(n, dtype=torch.int64),
            is_flush=torch.full((n,), not self.decode.speculative),
            extra={"drafts": self.states[1:].cpu().reshape(n, self.T, *self.state_shape).clone(),
                   "accepted": self.live.clone()})


def load(path: str | None = None) -> list[str]:
    """Register ``mamba-ssm-baseline`` when the file is found (the kernel is imported on first use);
    one-line ``RuntimeError`` otherwise."""
    root, have = find_root()
    register(MambaSSMBaseline, replace=True)
    return [f"{MambaSSMBaseline.family}/{MambaSSMBaseline.name} (mamba-ssm {have}, {root})"]
