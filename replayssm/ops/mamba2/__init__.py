"""Mamba-2: the literal model (naive.py, the truth in fp64) and the kernels under test beside it."""

from replayssm.ops.mamba2 import naive  # noqa: F401
