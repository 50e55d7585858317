"""Gated DeltaNet: the literal model (naive.py, the truth in fp64) and the kernels under test beside it."""

from replayssm.ops.gdn import naive  # noqa: F401
