"""The masked row copy drift's speculative pieces keep their states with (``replayssm/ops/triton/row_copy.py``).

Oracle: ``torch.where(mask.view(R, 1, ...), src.to(dst.dtype), dst)``.  Expected difference: none --
compared as raw bits (the Triton interpreter on a CPU; compiled on a GPU, the state shapes of
``nano4b`` / ``qwen35-4b`` at 8 rows, the size the full drift report runs).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.ops.triton.row_copy import can_copy_rows, copy_rows

pytestmark = pytest.mark.usefixtures("one_thread")

MASKS = {"none": [0, 0, 0], "all": [1, 1, 1], "r0r2": [1, 0, 1], "r1": [0, 1, 0]}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def _case(shape, src_dtype, mask, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    dst = torch.randn(shape, generator=g, dtype=torch.float64).to(device)
    src = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(src_dtype).to(device)
    m = torch.tensor(mask, dtype=torch.bool, device=device)
    want = torch.where(m.view(-1, *([1] * (len(shape) - 1))), src.to(torch.float64), dst)
    return dst, src, m, want


@pytest.mark.parametrize("src_dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("mask", list(MASKS.values()), ids=list(MASKS))
def test_copy_rows_is_where_bitwise(mask, src_dtype):
    # a row of 2 x 3 x 700 elements: more than one block of the kernel, the last one partial
    dst, src, m, want = _case((3, 2, 3, 700), src_dtype, mask)
    got = copy_rows(dst, src, m)
    assert got is dst
    assert torch.equal(_bits(got), _bits(want))


def test_copy_rows_keeps_nan_payloads_and_signed_zeros():
    dst = torch.zeros(2, 4, dtype=torch.float64)
    src = torch.tensor([[float("nan"), -0.0, float("inf"), 1e-310]] * 2, dtype=torch.float64)
    src.view(torch.int64)[0, 0] = 0x7FF8DEADBEEF0001  # a NaN with a payload
    copy_rows(dst, src, torch.tensor([True, False]))
    assert torch.equal(_bits(dst[0]), _bits(src[0]))
    assert torch.equal(_bits(dst[1]), _bits(torch.zeros(4, dtype=torch.float64)))


@pytest.mark.parametrize("what", ["dst-noncontiguous", "src-shape", "src-dtype", "mask-dtype", "mask-shape"])
def test_copy_rows_bad_arguments_change_nothing(what):
    dst = torch.zeros(3, 8, dtype=torch.float64)
    src = torch.ones(3, 8, dtype=torch.float64)
    mask = torch.ones(3, dtype=torch.bool)
    arg = {"dst-noncontiguous": "dst", "src-shape": "src", "src-dtype": "src", "mask-dtype": "mask",
           "mask-shape": "mask"}[what]
    if what == "dst-noncontiguous":
        dst = torch.zeros(8, 3, dtype=torch.float64).t()
    elif what == "src-shape":
        src = torch.ones(3, 9, dtype=torch.float64)
    elif what == "src-dtype":  # fp64 into fp32 would round: refused
        dst, src = dst.float(), src
    elif what == "mask-dtype":
        mask = torch.ones(3, dtype=torch.int64)
    else:
        mask = torch.ones(4, dtype=torch.bool)
    before = dst.clone()
    with pytest.raises(ValueError, match=rf"^{arg}: expected"):
        copy_rows(dst, src, mask)
    assert torch.equal(dst, before)


def test_can_copy_rows_names_the_pairs_copy_rows_accepts():
    f64 = torch.zeros(3, 4, dtype=torch.float64)
    assert can_copy_rows(f64, torch.zeros(3, 4, dtype=torch.float32))
    assert can_copy_rows(f64, torch.zeros(3, 4, dtype=torch.bfloat16))
    assert not can_copy_rows(f64.float(), f64)  # would round
    assert not can_copy_rows(f64, torch.zeros(3, 5, dtype=torch.float64))
    assert not can_copy_rows(f64, torch.zeros(4, 3, dtype=torch.float64).t())  # not contiguous
    for dst, src in ((f64, f64), (f64, f64.half()), (f64.float(), f64.float())):
        assert can_copy_rows(dst, src)
        copy_rows(dst, src, torch.ones(3, dtype=torch.bool))  # accepted


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", [(8, 96, 80, 128), (8, 32, 128, 128)], ids=["nano4b-R8", "qwen35-4b-R8"])
@pytest.mark.parametrize("src_dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_gpu_copy_rows_is_where_bitwise(shape, src_dtype):
    dst, src, m, want = _case(shape, src_dtype, [1, 0, 0, 1, 1, 0, 1, 0], device="cuda")
    copy_rows(dst, src, m)
    assert torch.equal(_bits(dst), _bits(want))
