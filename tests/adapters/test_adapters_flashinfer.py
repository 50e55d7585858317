"""The FlashInfer adapters' declarations (replayssm/adapters/flashinfer.py), on CPU: FlashInfer's
kernels are CUDA JIT, so what runs here is what must hold without a GPU -- the modes each kernel
declares and refuses (read from its CUDA sources), its ring constraints, and one-line availability.
The kernels themselves run in ``tests/adapters/test_adapters_gpu.py`` (the ``flashinfer`` profile).

Oracle: the kernels' own constraints as written in ``flashinfer/data/include/flashinfer/mamba``
(2-byte inputs for ``checkpointing_ssu``'s MMAs; stochastic rounding into fp16 / fp8 / int8 only;
ring = B + T' rows modulo B + T', at most 16 cached tokens) and the argument validators of
``flashinfer/data/csrc`` (``selective_state_update.cu``: ``validate_D_tensor``, ``validate_A_tensor``,
``validate_dt_bias_tensor``, the dt stride checks and ``validate_dtype_consistency``;
``checkpointing_ssu.cu``: its ``(tie_hdim)`` checks), transcribed below: the layout the adapter
passes must satisfy them exactly (a contiguous ``D`` was refused on the H200, 2026-12-01).
"""

import importlib.util

import pytest
import torch

from replayssm import adapters
from replayssm.adapters import flashinfer
from replayssm.adapters._base import SlotAdapter, broadcast_last
from replayssm.families import preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.validators.jobs.fuzz.run import is_interpreted

SPEC = DecodeConfig("speculative", 4, 12)


@pytest.mark.parametrize("mode,decode,reason", [
    ("s32a16", SPEC, None), ("s16a16", SPEC, None), ("sfp16a16-sr", SPEC, None), ("si8a16", SPEC, None),
    ("sfp8a16-sr", SPEC, None), ("s32a16", DecodeConfig("standard", 1, 15, "flush-when-full"), None),
    ("s32a32", SPEC, "2-byte activations"), ("s32a16-tf32", SPEC, "ieee modes only"),
    ("s16a16-sr", SPEC, "only into fp16, fp8 and int8"), ("s32a16", DecodeConfig("speculative", 2, 3), "power of two"),
    ("s32a16", DecodeConfig("speculative", 4, 28), "at most 16 cached tokens"),
], ids=["s32a16", "s16a16", "sfp16a16sr", "si8a16", "sfp8a16sr", "standard-L15", "s32a32", "tf32", "bf16-sr",
        "T2-B3", "T4-B28"])
def test_checkpointing_ssu_declares_what_it_implements(mode, decode, reason):
    got = flashinfer.FlashInferCheckpointing.unsupported_reason(parse_mode(mode), decode, {})
    assert (got is None) if reason is None else (reason in got), got


def test_selective_state_update_refuses_stochastic_and_scaled_states():
    cls = flashinfer.FlashInferSSU
    assert cls.unsupported_reason(parse_mode("s32a32"), SPEC, {}) is None
    assert "plain cast" in cls.unsupported_reason(parse_mode("sfp16a16-sr"), SPEC, {})
    assert "not fp8e4m3" in cls.unsupported_reason(parse_mode("sfp8a16"), SPEC, {})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU line")
def test_without_a_gpu_it_is_one_line_and_registers_nothing():
    ok, line = adapters.load(force=True)["flashinfer"]
    assert not ok and "\n" not in line
    if importlib.util.find_spec("flashinfer") is None:
        assert "not installed" in line and "flashinfer-python==0.7.2.post1" in line
    else:
        assert "GPU only" in line or "written against" in line


def _tie_hdim_errors(A, dt_bias, D, dt) -> list[str]:
    """FlashInfer 0.7.2.post1's stride checks on the per-head arguments (both kernels)."""
    errs = []
    if tuple(A.stride()) != (1, 0, 0):
        errs.append(f"A strides {tuple(A.stride())}, need (1, 0, 0)")
    for name, t in (("dt_bias", dt_bias), ("D", D)):
        if tuple(t.stride()) != (1, 0):
            errs.append(f"{name} strides {tuple(t.stride())}, need (1, 0)")
    if tuple(dt.stride()[-2:]) != (1, 0):
        errs.append(f"dt last strides {tuple(dt.stride()[-2:])}, need (1, 0)")
    return errs


@pytest.mark.parametrize("T", [1, 4], ids=["T1", "T4"])
def test_per_head_arguments_in_the_layout_the_kernels_validate(T):
    g = preset("super120b", "mamba2")
    H, P = g.nheads, g.headdim
    params = {"A": -torch.rand(H), "dt_bias": torch.rand(H), "D": torch.rand(H)}
    tied = flashinfer.tie_hdim(params, g)
    raw = torch.randn(3, T, H).to(torch.bfloat16)
    for dtype in (None, torch.float32):
        dt = flashinfer.tied_dt(raw, g, dtype)
        single = dt[:, 0]  # the single-token layout (batch, nheads, dim) the standard baseline passes
        assert _tie_hdim_errors(tied["A"], tied["dt_bias"], tied["D"], dt) == []
        assert _tie_hdim_errors(tied["A"], tied["dt_bias"], tied["D"], single) == []
        assert torch.equal(dt[..., 3], raw.to(dt.dtype)) and dt.shape == (3, T, H, P)
    for name in ("A", "dt_bias", "D"):  # views of the vectors: the kernel reads the parameters' own values
        assert torch.equal(tied[name].reshape(H, -1)[:, -1], params[name])
    contiguous_D = tied["D"].contiguous()  # the layout refused on the H200
    assert _tie_hdim_errors(tied["A"], tied["dt_bias"], contiguous_D, dt) == [f"D strides ({P}, 1), need (1, 0)"]


def test_selective_state_update_gets_dt_in_the_parameters_dtype():
    """validate_dtype_consistency: D and dt_bias must have dt's dtype; the parameters are fp32, so
    the baseline upcasts dt (exact); checkpointing_ssu types dt apart and takes the raw input."""
    assert flashinfer.FlashInferSSU.dt_dtype == torch.float32
    assert flashinfer.FlashInferCheckpointing.dt_dtype is None
    raw = torch.randn(2, 1, 3).to(torch.bfloat16)
    g = preset("super120b", "mamba2")
    assert flashinfer.tied_dt(raw, g, torch.float32).dtype == torch.float32
    assert flashinfer.tied_dt(raw, g).dtype == torch.bfloat16


def test_triton_sources_get_the_interpreter_strategy_on_cpu_and_flashinfer_does_not():
    """Adapters of Triton kernels (vLLM, SGLang, FLA, mamba_ssm) run through the interpreter on CPU,
    so the fuzzer gives them its small strategy; FlashInfer is CUDA JIT."""
    triton_adapter = type("SomeAdapter", (SlotAdapter,), {"name": "some-replay"})
    assert is_interpreted(triton_adapter, "cpu") and not is_interpreted(triton_adapter, "cuda")
    assert not is_interpreted(flashinfer.FlashInferSSU, "cpu")


@pytest.mark.parametrize("P", [1, 4], ids=["P1", "P4"])
def test_broadcast_dims_have_stride_zero_at_every_size(P):
    """``expand`` keeps a size-1 dimension's stride; the kernels detect a broadcast by stride 0 (vLLM's
    ``A.stride(-2) == 0`` assertion refused a head dimension of 1 under the fuzzer, 2026-12-01)."""
    A = torch.randn(3)
    assert A[:, None, None].expand(3, 1, 2).stride()[1] != 0  # the trap
    tied = broadcast_last(A, P, 2)
    assert tied.shape == (3, P, 2) and tied.stride() == (1, 0, 0)
    assert torch.equal(tied[:, -1, -1], A)
    g = {"nheads": 3, "headdim": P, "dstate": 2}
    geo = type("G", (), g)
    tied = flashinfer.tie_hdim({"A": A, "dt_bias": A, "D": A}, geo)
    assert _tie_hdim_errors(tied["A"], tied["dt_bias"], tied["D"], flashinfer.tied_dt(torch.randn(2, 1, 3), geo)) == []
