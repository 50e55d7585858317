"""Gated DeltaNet: the fp64 reference (naive.py), the literal models (literal.py), the family
registration (family.py) and the kernels under test beside them: Triton baseline (baseline.py) and
ReplaySSM (replay.py: replay_spec.py, replay_split.py and the delta rule's one-launch kernels)."""

from replayssm.ops.gdn import baseline, family, literal, naive, replay, variants  # noqa: F401
