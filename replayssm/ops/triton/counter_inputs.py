"""Scenario input values on the device in one launch per input name.

Oracle: ``scenarios/inputs.py``'s torch path -- ``_random_bits_flat`` (three rounds of the
``lowbias32`` hash of the element counter, keyed per segment) followed by ``_apply_law`` (the
quantile table's interval picked by the top 16 bits, linear interpolation by the low 16) and the
input's scale.  Expected difference: none, bit for bit.  The hash is exact 32-bit integer
arithmetic (Triton's ``uint32`` wraps as the torch path's masks do), the word's conversion to
fp64 and the ``2^-16`` / ``2^-32`` scalings are exact, and the interpolation ``table[j] + f diff[j]``
and the scale are separate IEEE fp64 products and sums (compiled with contraction off,
``enable_fp_fusion=False``: no FMA); the scale is read as fp64 from a tensor (a Python float
argument would be specialised to fp32).  tests/core/test_scenarios.py compares the two under the
Triton interpreter; its GPU test on a CUDA device.

Why: on a GPU the torch path is ~20 int64 elementwise passes and two gathers over every word
(int64 multiplies are emulated); at ``nano4b`` and 64 rows the drift fast path's chunk of inputs
took a large share of the step's device time (unrecorded).  Here each word is
hashed, looked up and written in registers: one fp64 write per value.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _lowbias32(x):
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _counter_values_kernel(keys_ptr, table_ptr, diff_ptr, scale_ptr, out_ptr, count, total,
                           TABLE: tl.constexpr, SCALED: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < total
    seg = idx // count
    i = (idx - seg * count).to(tl.uint32)  # the element counter inside its segment (< 2^31: its high word is 0)
    k1 = tl.load(keys_ptr + seg * 3, mask=m, other=0).to(tl.uint32)
    k2 = tl.load(keys_ptr + seg * 3 + 1, mask=m, other=0).to(tl.uint32)
    k3 = tl.load(keys_ptr + seg * 3 + 2, mask=m, other=0).to(tl.uint32)
    h = _lowbias32(i ^ k1)
    h = _lowbias32(h ^ k2)
    h = _lowbias32(h ^ k3)
    if TABLE:
        j = (h >> 16).to(tl.int32)
        f = (h & 0xFFFF).to(tl.float64) * 0.0000152587890625  # 2^-16, exact
        v = tl.load(table_ptr + j, mask=m, other=0.0) + f * tl.load(diff_ptr + j, mask=m, other=0.0)
    else:
        v = h.to(tl.float64) * 2.3283064365386963e-10  # 2^-32, exact
    if SCALED:
        v = v * tl.load(scale_ptr)
    tl.store(out_ptr + idx, v, mask=m)


_SCALES: dict[tuple[float, str], torch.Tensor] = {}


def _scale(scale: float, dev: torch.device) -> torch.Tensor:
    """``scale`` as a one-element fp64 tensor on ``dev``, made once (a host-to-device copy of a fresh tensor
    waits for the device)."""
    key = (float(scale), str(dev))
    if key not in _SCALES:
        _SCALES[key] = torch.tensor([scale], dtype=torch.float64, device=dev)
    return _SCALES[key]


def counter_values(key_words: torch.Tensor, count: int, table: tuple[torch.Tensor, torch.Tensor] | None,
                   scale: float = 1.0) -> torch.Tensor:
    """fp64 values ``[len(key_words) * count]``: segment ``s`` holds counters ``0 .. count - 1`` under the
    key words ``key_words[s] = (k1, k2, k3)`` (int64 ``[S, 3]``, each in ``[0, 2^32)``), each value
    ``table[0][j] + f table[1][j]`` of the word's top / low 16 bits (``table``: the law's quantiles and
    their differences, fp64 on the same device) or the uniform ``word 2^-32`` (``table=None``), times
    ``scale`` unless it is 1."""
    if key_words.dim() != 2 or key_words.shape[1] != 3 or key_words.dtype != torch.int64:
        raise ValueError(f"key_words: expected an int64 [S, 3] tensor, got {key_words.dtype} {tuple(key_words.shape)}")
    if not 1 <= count < 2**31:
        raise ValueError(f"count: expected 1 <= count < 2^31 words per segment, got {count}")
    dev = key_words.device
    if table is not None and any(t.dtype != torch.float64 or t.device != dev for t in table):
        raise ValueError("table: expected the quantiles and differences as fp64 tensors on the keys' device")
    total = key_words.shape[0] * count
    out = torch.empty(total, dtype=torch.float64, device=dev)
    if total == 0:
        return out
    tab, dif = table if table is not None else (out, out)  # unused without a table
    sc = _scale(scale, dev)
    with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
        _counter_values_kernel[(triton.cdiv(total, BLOCK),)](
            key_words.contiguous(), tab, dif, sc, out, count, total, TABLE=table is not None,
            SCALED=scale != 1.0, BLOCK=BLOCK, enable_fp_fusion=False)
    return out


__all__ = ["counter_values"]
