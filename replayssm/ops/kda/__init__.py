"""Kimi Delta Attention: the fp64 reference (naive.py), the literal models (literal.py) and the
family registration (family.py)."""

from replayssm.ops.kda import family, literal, naive  # noqa: F401
from replayssm.ops.kda import kernels  # noqa: F401  (the Triton kernels under test)
