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
import sys
import types
from pathlib import Path

import torch

from replayssm.adapters._base import broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._draft_states import DraftStatesAdapter
from replayssm.adapters._sdist_root import sdist_or_install_root
from replayssm.adapters._vllm_source import launch_guard
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
    root, have = sdist_or_install_root(env=ENV, file=FILE, package="mamba_ssm", label="mamba_ssm", dist="mamba-ssm",
                                       version=VERSION, how=HOW, error=RuntimeError, resolve=False)
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


class MambaSSMBaseline(DraftStatesAdapter):
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

    def _drafts(self) -> torch.Tensor:
        return self.states[1:].reshape(self.num_slots, self.T, *self.state_shape)


def load(path: str | None = None) -> list[str]:
    """Register ``mamba-ssm-baseline`` when the file is found (the kernel is imported on first use);
    one-line ``RuntimeError`` otherwise."""
    root, have = find_root()
    register(MambaSSMBaseline, replace=True)
    return [f"{MambaSSMBaseline.family}/{MambaSSMBaseline.name} (mamba-ssm {have}, {root})"]
