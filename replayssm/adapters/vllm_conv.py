"""vLLM's ``causal_conv1d_update`` (its Triton decode conv, the ``lazy-offset`` design) as the conv of a
mixer kernel under test: ``mixer-vllm-conv`` = vLLM's conv update (``num_accepted_tokens``, extended
state of d_conv - 1 + T' - 1 inputs per slot, ``conv_state_indices`` = the slots) + the family's
literal ReplaySSM + the literal gated norm.  At the mixer level it is validated like any mixer kernel.

The kernel is loaded unchanged from a vLLM source tree (``REPLAYSSM_VLLM_SRC=PATH``, e.g.
``../shared/peers/vllm-0.33.0`` or the ReplaySSM fork; only ``vllm/model_executor/layers/mamba/ops/
causal_conv1d.py`` is needed) the way ``_vllm_source`` loads the ReplaySSM kernels: vLLM's package
``__init__`` files are not run and its few internals get stand-ins.  On CPU it runs through the Triton
interpreter (``TRITON_INTERPRET=1``); without a tree the kernel is refused with the reason.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from replayssm.adapters import _vllm_source as src
from replayssm.adapters._external_conv import ChannelsFirstConvStore, ExternalConvMixer
from replayssm.adapters._vllm033_source import _import_from_tree as import_from_tree
from replayssm.adapters._vllm033_source import _vllm_installed
from replayssm.interface import PAD_SLOT
from replayssm.mixer.kernel import register_mixer_kernel
from replayssm.ops.conv.literal import LazyOffsetStore

MODULE = f"{src.MAMBA_OPS}.causal_conv1d"
_CONV = None


def load_conv(path: str | None = None):
    """vLLM's ``causal_conv1d`` module from the tree at ``path`` (default ``$REPLAYSSM_VLLM_SRC``)."""
    global _CONV
    if _CONV is not None:
        return _CONV
    given = path or os.environ.get(src.ENV)
    if not given:
        raise src.SourceUnavailable(f"vLLM causal_conv1d_update: no source tree; set {src.ENV}=PATH (a vLLM "
                                    f"checkout, e.g. ../shared/peers/vllm-0.33.0)")
    root = Path(given).expanduser().resolve()
    if not (root / src._rel(MODULE)).is_file():
        raise src.SourceUnavailable(f"vLLM causal_conv1d_update: {src._rel(MODULE)} not found under {given!r} "
                                    f"({src.ENV})")
    if not _vllm_installed():
        src._install_stand_ins()
        src._stand_in("vllm.v1.attention.backends.utils", PAD_SLOT_ID=PAD_SLOT)
        plat = sys.modules["vllm.platforms"].current_platform
        plat.is_arch_support_pdl = lambda: False
        plat.is_cpu = lambda: False  # the Triton kernel, not vLLM's CPU substitute
    try:  # imported beside whatever vLLM source this process already loaded (sys.modules given back)
        _CONV = import_from_tree(root, (MODULE,))[MODULE]
    except Exception as e:  # one line, never a traceback
        raise src.SourceUnavailable(f"vLLM causal_conv1d_update from {root}: import failed "
                                    f"({type(e).__name__}: {e})") from None
    return _CONV


class VLLMConvStore(ChannelsFirstConvStore, LazyOffsetStore):
    """The lazy-offset layout, its verify done by vLLM's kernel (conv + SiLU, fp32 accumulation)."""

    load_kernel = staticmethod(load_conv)

    def conv_update(self, mod, xs, slots, weight, bias):
        o = torch.empty_like(xs)
        idx = torch.tensor(slots, dtype=torch.int32, device=xs.device)
        acc = self.tensors["accepted"][slots].to(torch.int32).to(xs.device)
        w = weight.to(self.act).contiguous()
        b = None if bias is None else bias.to(self.act).contiguous()
        with src.launch_guard(xs.device):
            mod.causal_conv1d_update(xs, self.tensors["state"], w, b, activation="silu", conv_state_indices=idx,
                                     num_accepted_tokens=acc if self.T > 1 else None, null_block_id=PAD_SLOT,
                                     out=o)
        return o


@register_mixer_kernel
class VLLMConvMixer(ExternalConvMixer):
    name = "mixer-vllm-conv"
    description = "vLLM causal_conv1d_update (lazy offset, num_accepted_tokens) + the literal ReplaySSM"
    conv_policy = "lazy-offset"
    store = VLLMConvStore
    triton_conv = True
    load_source = staticmethod(load_conv)
    source_error = src.SourceUnavailable
    # measured: NaN outputs at s32a16 under the interpreter (its bf16 arithmetic, spec 9), the stored conv
    # window still exact; the GPU runs bf16
    bf16_interpreter_reason = ("bf16 activations under the Triton interpreter (its bf16 arithmetic is wrong); use a "
                               "GPU or s32a32")

    @classmethod
    def unsupported_reason(cls, geometry, mode):
        return cls.source_reason() or cls.triton_reason(mode)
