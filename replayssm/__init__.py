"""replayssm: numerical validation and drift testing for ReplaySSM-style decode kernels."""

from replayssm.geometry import GDNGeometry, Mamba2Geometry, preset
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig, KernelSnapshot, KernelUnderTest
from replayssm.precision import PrecisionMode, parse_mode
from replayssm.registry import build, get, kernels, register

__version__ = "0.1.0"

__all__ = [
    "PAD_SLOT", "DecodeConfig", "GDNGeometry", "KernelConfig", "KernelSnapshot", "KernelUnderTest",
    "Mamba2Geometry", "PrecisionMode", "build", "get", "kernels", "parse_mode", "preset", "register",
]
