"""Broken mixer kernels (the literal mixer with one conv-state bug each, ``replayssm/ops/conv/mutants.py``),
registered as mixer kernels; each must fail the default mixer validation (tests/engine/test_mixer.py)."""

from __future__ import annotations

from replayssm.mixer.kernel import ComposedMixer, register_mixer_kernel
from replayssm.ops.conv import mutants as m

MUTANTS = {
    "mutant-conv-no-rollback": (m.NoRollbackStore, "compact-at-commit",
                                "vLLM #50272: the commit keeps the rejected tokens' conv inputs"),
    "mutant-conv-count-clamped": (m.CountClampedStore, "lazy-offset",
                                  "xLLM #2249: the accepted count clamped to d_conv - 1"),
    "mutant-conv-block-boundary": (m.BlockBoundaryStore, "lazy-offset",
                                   "vLLM #42792: after a block boundary the window is read from the never-written "
                                   "destination column"),
    "mutant-conv-unwritten-snapshot": (m.UnwrittenSnapshotStore, "draft-snapshots",
                                       "llama.cpp #28466: only the last draft position's window is saved"),
}

for _name, (_store, _policy, _why) in MUTANTS.items():
    register_mixer_kernel(type(_name.replace("-", "_"), (ComposedMixer,), {
        "name": _name, "store": _store, "conv_policy": _policy, "description": _why}))
