"""Mamba-2: the literal model (naive.py, the truth in fp64) and the kernels under test beside it:
Triton "triton-baseline" (baseline.py), "triton-replay" / "triton-replay-state" (replay.py)."""

from replayssm.ops.mamba2 import baseline, naive, replay  # noqa: F401
