"""The FlashInfer adapters' declarations (replayssm/adapters/flashinfer.py), on CPU: FlashInfer's
kernels are CUDA JIT, so what runs here is what must hold without a GPU -- the modes each kernel
declares and refuses (read from its CUDA sources), its ring constraints, and one-line availability.
The kernels themselves run in ``tests/test_adapters_gpu.py`` (``tools/flashinfer_h200.sh``).

Oracle: the kernels' own constraints as written in ``flashinfer/data/include/flashinfer/mamba``
(2-byte inputs for ``checkpointing_ssu``'s MMAs; stochastic rounding into fp16 / fp8 / int8 only;
ring = B + T' rows modulo B + T', at most 16 cached tokens).
"""

import importlib.util

import pytest
import torch

from replayssm import adapters
from replayssm.adapters import flashinfer
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode

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
