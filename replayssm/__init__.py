"""replayssm: numerical validation and drift testing for ReplaySSM-style decode kernels."""

import os as _os

import torch as _torch

# Without a CUDA device, Triton kernels run through the Triton interpreter: the switch must be
# set before any kernel module is imported (triton reads it when a kernel is decorated).
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from replayssm.geometry import GDNGeometry, Mamba2Geometry, preset
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig, KernelSnapshot, KernelUnderTest
from replayssm.precision import PrecisionMode, parse_mode
from replayssm.registry import build, get, kernels, register

__version__ = "0.1.0"

__all__ = [
    "PAD_SLOT", "DecodeConfig", "GDNGeometry", "KernelConfig", "KernelSnapshot", "KernelUnderTest",
    "Mamba2Geometry", "PrecisionMode", "build", "get", "kernels", "parse_mode", "preset", "register",
]
