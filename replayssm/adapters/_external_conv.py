"""What the conv adapters share (``mixer-causal-conv1d``, ``mixer-fla-shortconv``, ``mixer-sglang-conv``,
``mixer-vllm-conv``): a composed mixer whose conv is external code, refused with its loader's one-line
reason when that code cannot be loaded, and, for a Triton conv, refused where Triton cannot run it as
the GPU does (no CUDA device and no interpreter; bf16 activations under the interpreter, whose
fp32 -> bf16 store truncates); and, for a conv kernel that takes the named rows channels first
(causal-conv1d's, SGLang's and vLLM's ``causal_conv1d_update``), the store's verify around it.

Oracle: none of its own (it only decides what is refused); the mixer runner judges the kernels.
Expected error: not applicable (refusal texts, each adapter's own).
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from replayssm.mixer.kernel import ComposedMixer

BF16_INTERPRETER_REASON = ("bf16 activations under the Triton interpreter (its fp32 -> bf16 store truncates); use a "
                           "GPU, s32a32 or s32afp16")


def interpreting() -> bool:
    """Whether Triton runs through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class ChannelsFirstConvStore:
    """A conv store's verify around a kernel that takes the named rows channels first: the rows of
    ``x [R, T', C]`` named in ``rows`` as ``[n, C, T']`` (contiguous), the kernel's ``[n, C, T']``
    outputs written back to those rows (zeros elsewhere).  A store supplies ``load_kernel()`` (run
    first, on every verify) and ``conv_update(mod, xs, slots, weight, bias)``."""

    @staticmethod
    def load_kernel():
        raise NotImplementedError

    def conv_update(self, mod, xs: torch.Tensor, slots: list[int], weight, bias) -> torch.Tensor:
        raise NotImplementedError

    def verify(self, rows, x, weight, bias):
        mod = self.load_kernel()
        out = torch.zeros_like(x)
        if not rows:
            return out
        rr, slots = [r for r, _ in rows], [s for _, s in rows]
        o = self.conv_update(mod, x[rr].transpose(1, 2).contiguous(), slots, weight, bias)
        out[rr] = o.transpose(1, 2)
        return out


class ExternalConvMixer(ComposedMixer):
    """A composed mixer whose conv comes from ``load_source`` (which raises ``source_error`` when the
    code cannot be loaded)."""

    source_error: ClassVar[type[Exception]] = RuntimeError
    source_first_line: ClassVar[bool] = False  # the reason is the error's first line (else its whole text)
    no_device_reason: ClassVar[str] = "no CUDA device: run with TRITON_INTERPRET=1 (the Triton interpreter)"
    bf16_interpreter_reason: ClassVar[str] = BF16_INTERPRETER_REASON

    @staticmethod
    def load_source():
        """Load the external conv code (once per process); raise ``source_error`` with one line saying how to
        get it."""
        raise NotImplementedError

    @classmethod
    def source_reason(cls) -> str | None:
        try:
            cls.load_source()
        except cls.source_error as e:
            return str(e).splitlines()[0] if cls.source_first_line else str(e)
        return None

    @classmethod
    def triton_reason(cls, mode) -> str | None:
        """Why a Triton conv cannot be judged at ``mode`` here: no CUDA device and no interpreter, or bf16
        activations under the interpreter; None otherwise."""
        if not torch.cuda.is_available() and not interpreting():
            return cls.no_device_reason
        if interpreting() and mode.act_dtype == torch.bfloat16:
            return cls.bf16_interpreter_reason
        return None
