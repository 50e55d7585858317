"""The bf16-part tensor-core product (replayssm/ops/triton/split_dot.py) against fp64 matmul: three
parts rebuild an fp32 value exactly, and the six kept part products give an fp32-accurate result
(here under the interpreter, which multiplies the same parts; the GPU runs them on tensor cores:
tests/ops/gdn/test_gdn_triton.py's split readouts through the engine)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from replayssm.ops.triton.rounding import INTERPRET
from replayssm.ops.triton.split_dot import parts, split3, split_dot


@triton.jit
def _parts_kernel(x_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    hi, mid, lo = split3(tl.load(x_ptr + o))
    tl.store(out_ptr + o, hi.to(tl.float32))
    tl.store(out_ptr + N + o, mid.to(tl.float32))
    tl.store(out_ptr + 2 * N + o, lo.to(tl.float32))


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, NA: tl.constexpr,
                NB: tl.constexpr, INTERP: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], split_dot(a, b, NA, NB, INTERP))


def _dev():
    return "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"


def test_three_parts_rebuild_fp32_exactly():
    x = torch.randn(256, generator=torch.Generator().manual_seed(0)) * torch.logspace(-8, 8, 256)
    out = torch.empty(3 * 256)
    x, out = x.to(_dev()), out.to(_dev())
    _parts_kernel[(1,)](x, out, N=256)
    p = out.view(3, 256).double().cpu()
    assert torch.equal(p.sum(0), x.double().cpu())
    assert torch.equal(p[0].bfloat16().double(), p[0]) and torch.equal(p[2].bfloat16().double(), p[2])


@pytest.mark.parametrize("a_dtype,b_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                             (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                             (torch.float32, torch.float16)],
                         ids=["a32-b32", "a16-b32", "abf16-b32", "a32-bbf16", "a32-b16"])
def test_split_dot_is_fp32_accurate(a_dtype, b_dtype):
    gen = torch.Generator().manual_seed(1)
    M, K, N = 32, 64, 16
    a = torch.randn(M, K, generator=gen).to(a_dtype).float()
    b = torch.randn(K, N, generator=gen).to(b_dtype).float()
    c = torch.empty(M, N)
    dev = _dev()
    _dot_kernel[(1,)](a.to(dev), b.to(dev), c := c.to(dev), M=M, K=K, N=N, NA=parts(a_dtype), NB=parts(b_dtype),
                      INTERP=dev == "cpu")
    exact = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    err = ((c.double().cpu() - exact) / scale).abs().max().item()
    # an fp32 reduction of K terms: about K * 2^-24 / 2 at worst; a dropped bf16 part is 2^-9 (one part of
    # an fp32 a: 2e-3 measured here); the bound is 16 fp32 ulps
    assert err < 16 * 2.0 ** -24, err


def test_parts_by_dtype():
    assert [parts(d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)] == [3, 2, 1, 3]
