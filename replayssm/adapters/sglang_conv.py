"""SGLang 0.5.23's Triton ``causal_conv1d_update`` under speculative decoding (the ``draft-snapshots``
design: ``intermediate_conv_window``) as the conv of a mixer kernel under test: ``mixer-sglang-conv`` =
its conv update + the family's literal ReplaySSM + the literal gated norm.

The kernel file ``sglang/kernels/ops/mamba/causal_conv1d_triton.py`` is imported unchanged from the
installed package (``pip install --no-deps sglang==0.5.23``) the way ``sglang.py`` imports the ReplaySSM
kernels (no package ``__init__`` runs; its one helper, ``is_arch_support_pdl``, is a stand-in).  On CPU
it runs through the Triton interpreter (``TRITON_INTERPRET=1``), fp64, fp32 and fp16 activations only: the
interpreter's fp32 -> bf16 store truncates (round toward zero) where the GPU rounds to nearest, so bf16
activations are refused there with that reason.

Verify, as SGLang's Mamba mixer launches it at target verify (``srt/layers/attention/mamba/mamba.py``):
``conv_state [slots, C, d_conv - 1]`` (the committed window), ``conv_state_indices`` = the slots,
``intermediate_conv_window [slots, T', C, d_conv - 1]`` with ``intermediate_state_indices`` = the slots,
no ``num_accept_tokens``: the kernel reads the committed window, writes every draft position's window
into the snapshots, and also shifts all T' inputs into ``conv_state`` (the all-accepted window).  Commit
(k accepted): the committed window becomes snapshot k - 1.  SGLang's commit kernel
(``mamba_state_scatter_triton.fused_conv_window_scatter_with_mask``) refuses tensors that are not on
CUDA/XPU, so the adapter's commit is the design's copy (the literal store's ``commit_slot``) on every
device.

Oracle: the mixer runner (fp64 whole step, the tolerance rule against the literal mixer, the committed
window bit for bit read by the ``draft-snapshots`` rule).  Expected error: the literal mixer's order
(fp32 accumulation, one rounding to the activation dtype), the snapshots exact (data movement).
"""

from __future__ import annotations

import importlib
import types

import torch

from replayssm.adapters import sglang as sg
from replayssm.adapters._external_conv import ChannelsFirstConvStore, ExternalConvMixer
from replayssm.adapters._vllm_source import launch_guard
from replayssm.interface import PAD_SLOT
from replayssm.mixer.kernel import register_mixer_kernel
from replayssm.ops.conv.literal import DraftSnapshotsStore

MODULE = "sglang.kernels.ops.mamba.causal_conv1d_triton"
_LOADED: dict[str, types.ModuleType] = {}


def conv_module() -> types.ModuleType:
    """SGLang's ``causal_conv1d_triton`` module; ``RuntimeError`` (one line) when it cannot be imported."""
    if "conv" not in _LOADED:
        sg.modules()  # the installed version checked, the package stand-ins in place
        try:
            _LOADED["conv"] = importlib.import_module(MODULE)
        except Exception as e:  # one line, never a traceback
            raise RuntimeError(f"sglang {sg.VERSION}: importing {MODULE} failed ({type(e).__name__}: {e}); "
                               f"{sg.HOW}") from None
    return _LOADED["conv"]


class SGLangConvStore(ChannelsFirstConvStore, DraftSnapshotsStore):
    """The draft-snapshots layout, its verify done by SGLang's kernel (conv + SiLU, fp32 accumulation)."""

    load_kernel = staticmethod(conv_module)

    def conv_update(self, mod, xs, slots, weight, bias):
        idx = torch.tensor(slots, dtype=torch.int32, device=xs.device)
        w = weight.contiguous()  # the compute dtype (fp32; fp64 at s64a64), values of the activation dtype
        b = None if bias is None else bias.contiguous()
        with launch_guard(xs.device):
            return mod.causal_conv1d_update(xs, self.tensors["state"], w, b, activation="silu", conv_state_indices=idx,
                                            intermediate_conv_window=self.tensors["snapshots"],
                                            intermediate_state_indices=idx, pad_slot_id=PAD_SLOT)


@register_mixer_kernel
class SGLangConvMixer(ExternalConvMixer):
    name = "mixer-sglang-conv"
    description = (f"SGLang {sg.VERSION} causal_conv1d_update (Triton; draft snapshots, intermediate_conv_window) "
                   "+ the literal ReplaySSM")
    conv_policy = "draft-snapshots"
    store = SGLangConvStore
    triton_conv = True
    load_source = staticmethod(conv_module)
    source_first_line = True

    @classmethod
    def unsupported_reason(cls, geometry, mode):
        # bf16 under the interpreter, measured (tests/adapters/test_mixer_conv_adapters.py): its fp32 -> bf16 store
        # rounds toward zero, so the conv outputs carry a one-signed bias and s32a16 fails ssm-state; the GPU runs bf16
        reason = cls.source_reason() or cls.triton_reason(mode)
        if reason:
            return reason
        if not 2 <= geometry.d_conv <= 4:
            return f"SGLang's conv update computes d_conv 2..4 (its KERNEL_WIDTH branches), got {geometry.d_conv}"
        return None
