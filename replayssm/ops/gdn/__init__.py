"""Gated DeltaNet: the literal model (naive.py, the truth in fp64) and the kernels under test beside it:
Triton baseline (baseline.py) and ReplaySSM (replay.py: replay_decode.py, replay_spec.py)."""

from replayssm.ops.gdn import baseline, naive, replay  # noqa: F401
