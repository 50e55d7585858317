"""replayssm: numerical validation and drift testing for ReplaySSM-style decode kernels."""

import os as _os

import torch as _torch

# Without a CUDA device, Triton kernels run through the Triton interpreter: the switch must be
# set before any kernel module is imported (triton reads it when a kernel is decorated).
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from replayssm.families import Family, geometry_from_dict, preset, register_family
from replayssm.families import family as _family
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig, KernelSnapshot, KernelUnderTest
from replayssm.precision import PrecisionMode, parse_mode
from replayssm.registry import build, get, kernels, register

__version__ = "0.1.0"

# Geometry classes by their usual names, looked up in the family registry on first use (importing
# replayssm does not import the families' Triton kernels).
_GEOMETRIES = {"Mamba2Geometry": "mamba2", "GDNGeometry": "gdn"}


def __getattr__(name: str):
    if name in _GEOMETRIES:
        return _family(_GEOMETRIES[name]).geometry_cls
    raise AttributeError(f"module 'replayssm' has no attribute {name!r}")


__all__ = [
    "PAD_SLOT", "DecodeConfig", "Family", "GDNGeometry", "KernelConfig", "KernelSnapshot", "KernelUnderTest",
    "Mamba2Geometry", "PrecisionMode", "build", "geometry_from_dict", "get", "kernels",
    "parse_mode", "preset", "register", "register_family",
]
