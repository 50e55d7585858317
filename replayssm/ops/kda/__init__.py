"""Kimi Delta Attention: the fp64 reference (naive.py), the literal models (literal.py) and the
family registration (family.py)."""

from replayssm.ops.kda import family, kernels, literal, mutants, naive, variants  # noqa: F401
