"""The per-row state error drift measures flushes and samples with (``replayssm/ops/triton/row_error.py``).

Oracle: the torch expression ``||a - b|| / max(||b||, TINY)`` per row in fp64; expected difference: the
rounding of another summation order, within 1e-13 relative.  Bit for bit: a row's error is the same
computed among all rows, among a selection (``index_select``) and in place under a mask (what drift's
fast path does inside a CUDA graph, against the slow path's selection), and ``metrics.row_rel_l2_masked``
gives ``metrics.row_rel_l2``'s bits on the marked rows (the Triton interpreter on a CPU; compiled on a
GPU at the 8-row state shapes of ``nano4b`` / ``qwen35-4b``).
"""

from __future__ import annotations

import pytest
import torch
import triton

from replayssm.ops.triton.row_error import BLOCK, MAX_BLOCKS, _block, row_rel_l2_rows
from replayssm.validators.engine.metrics import TINY, row_rel_l2, row_rel_l2_masked

pytestmark = pytest.mark.usefixtures("one_thread")


def _torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    d = a.to(torch.float64).flatten(1) - b.to(torch.float64).flatten(1)
    return torch.linalg.vector_norm(d, dim=1) / torch.linalg.vector_norm(b.to(torch.float64).flatten(1),
                                                                          dim=1).clamp_min(TINY)


def _pair(shape, a_dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    a = (b + 1e-5 * torch.randn(shape, generator=g, dtype=torch.float64)).to(a_dtype)
    return a.to(device), b.to(device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64)


@pytest.mark.parametrize("a_dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["f64", "f32", "bf16"])
def test_row_error_is_the_torch_expression(a_dtype):
    # rows of 2 x 3 x 700 elements: two blocks, the last one partial
    a, b = _pair((4, 2, 3, 700), a_dtype)
    got, want = row_rel_l2_rows(a, b), _torch(a, b)
    assert got.dtype == torch.float64 and got.shape == (4,)
    assert torch.allclose(got, want, rtol=1e-13, atol=0)


def test_row_error_zero_reference_and_non_finite_rows():
    a, b = _pair((4, 50), torch.float32)
    b[1] = 0.0  # an all-zero reference row: the norm over TINY, as the torch expression
    a[2, 7] = float("nan")
    a[3, 0] = float("inf")
    got = row_rel_l2_rows(a, b)
    assert torch.allclose(got[:2], _torch(a, b)[:2], rtol=1e-13, atol=0)
    assert got[1] > 1e290
    assert torch.isnan(got[2]) and not torch.isfinite(got[3])


def test_a_row_is_the_same_bits_among_any_rows_and_under_a_mask():
    a, b = _pair((5, 3, 1500), torch.float32)
    whole = row_rel_l2_rows(a, b)
    idx = torch.tensor([1, 3, 4])
    assert torch.equal(_bits(row_rel_l2_rows(a[idx], b[idx])), _bits(whole[idx]))
    mask = torch.tensor([False, True, False, True, True])
    out = torch.full((5,), -7.0, dtype=torch.float64)
    assert row_rel_l2_rows(a, b, out, mask) is out
    assert torch.equal(_bits(out[idx]), _bits(whole[idx]))
    assert (out[[0, 2]] == -7.0).all()  # the unmarked rows untouched
    none = torch.full((5,), -7.0, dtype=torch.float64)
    row_rel_l2_rows(a, b, none, torch.zeros(5, dtype=torch.bool))
    assert (none == -7.0).all()


def test_masked_metric_is_the_metric_on_the_marked_rows():
    """``row_rel_l2_masked`` (the fast path's, in place) against ``row_rel_l2`` of the selected rows (the slow
    path's): the same bits (on a CPU both are the torch expression)."""
    a, b = _pair((4, 6, 64), torch.float32)
    mask = torch.tensor([True, False, False, True])
    out = torch.full((4,), -1.0, dtype=torch.float64)
    row_rel_l2_masked(a, b, mask, out)
    sel = torch.tensor([0, 3])
    assert torch.equal(_bits(out[sel]), _bits(row_rel_l2(a[sel], b[sel])))
    assert (out[[1, 2]] == -1.0).all()


def test_block_length_is_fixed_by_the_row_length():
    for n in (1, BLOCK, BLOCK * MAX_BLOCKS, BLOCK * MAX_BLOCKS + 1, 983_040 * 64):
        blk = _block(n)
        assert blk >= BLOCK and blk & (blk - 1) == 0 and triton.cdiv(n, blk) <= MAX_BLOCKS


@pytest.mark.parametrize("what", ["a-dtype", "b-shape", "out-dtype", "out-shape", "mask-dtype", "mask-shape"])
def test_row_error_bad_arguments(what):
    a, b = _pair((3, 40), torch.float32)
    out = torch.full((3,), -1.0, dtype=torch.float64)
    mask = torch.ones(3, dtype=torch.bool)
    kw = {"a": a, "b": b, "out": out, "mask": mask}
    arg = what.split("-")[0]
    kw[arg] = {"a-dtype": a.to(torch.int32), "b-shape": b[:2], "out-dtype": out.float(), "out-shape": out[:2],
               "mask-dtype": mask.to(torch.uint8), "mask-shape": mask[:2]}[what]
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        row_rel_l2_rows(**kw)
    assert (out == -1.0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", [(8, 96, 80, 128), (8, 32, 128, 128)], ids=["nano4b-R8", "qwen35-4b-R8"])
@pytest.mark.parametrize("a_dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_gpu_row_error_masked_is_selected_bitwise(shape, a_dtype):
    a, b = _pair(shape, a_dtype, device="cuda")
    whole = row_rel_l2_rows(a, b)
    assert torch.allclose(whole, _torch(a, b), rtol=1e-13, atol=0)
    for rows in ([0], [2, 5], [1, 3, 4, 6, 7]):
        idx = torch.tensor(rows, device="cuda")
        mask = torch.zeros(shape[0], dtype=torch.bool, device="cuda")
        mask[idx] = True
        out = torch.full((shape[0],), -1.0, dtype=torch.float64, device="cuda")
        row_rel_l2_masked(a, b, mask, out)
        sel = row_rel_l2(a.index_select(0, idx), b.index_select(0, idx))
        assert torch.equal(_bits(out[idx]), _bits(sel)) and torch.equal(_bits(sel), _bits(whole[idx]))
        assert (out[~mask] == -1.0).all()
