"""The fp64 references' readout sum in one fixed order: a pairwise (halving) tree over the last dimension.

``torch.sum`` adds in an order of its own choosing (SIMD width on a CPU, the block shape on a GPU),
which no other program can reproduce.  The references' state-sized readouts (``S C`` of Mamba-2,
``S k`` and ``S q`` of Gated DeltaNet) and the readout magnitudes of the fp64 bound sum in this
order instead, so that the same bits come out on a CPU, on a GPU and from a fused Triton pass that
computes the sum beside the state update (``ops/triton/reference.py``, drift's fast path): level by
level, ``x[..., :h] + x[..., h:]`` with ``h`` half the (zero-padded, power-of-two) length.  Each add
is one IEEE operation, so the order fixes the bits.

Oracle: exact arithmetic; in fp64 its error is ``log2(n)`` roundings per sum, the same bound as any
summation order (tests/core/test_reference.py keeps the references within 1e-12 of the SSD / chunked
forms; tests/core/test_ordered_sum.py the order itself).

On a CPU the levels are NumPy adds on the tensor's memory (an IEEE binary64 / binary32 add is the
same operation in NumPy and torch, and a small NumPy add costs a fifth of a torch call: the fp64
references sum tiny tensors tens of thousands of times in a drift run); tests/core/test_ordered_sum.py
holds both forms to the same bits.
"""

from __future__ import annotations

import numpy as np
import torch

_NUMPY_DTYPES = (torch.float64, torch.float32)


def pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension as a halving tree: ``x[..., :h] + x[..., h:]`` until one remains
    (the length zero-padded to a power of two first)."""
    n = x.shape[-1]
    if n == 0:
        return x.sum(-1)
    width = 1 << (n - 1).bit_length()
    if x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES and not x.requires_grad:
        return _pairwise_numpy(x.numpy(), n, width)
    if width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    while width > 1:
        width //= 2
        x = torch.add(x[..., :width], x[..., width:])
    return x[..., 0]


def _pairwise_numpy(a: np.ndarray, n: int, width: int) -> torch.Tensor:
    if width != n:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], width - n), dtype=a.dtype)], axis=-1)
    while width > 1:
        width //= 2
        a = a[..., :width] + a[..., width:]
    return torch.from_numpy(np.ascontiguousarray(a[..., 0]))


__all__ = ["pairwise_sum"]
