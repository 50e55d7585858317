"""Mamba-2: the fp64 reference (naive.py), the literal models (literal.py), the family registration
(family.py) and the kernels under test beside them: Triton "triton-baseline" (baseline.py),
"triton-replay" / "triton-replay-state" (replay.py)."""

from replayssm.ops.mamba2 import baseline, family, literal, naive, replay, variants  # noqa: F401
