"""Broken Mamba-2 kernels: slips of Mamba-2's own arithmetic, each one bug in the literal math.

Oracle: each mixin is :class:`~replayssm.ops.mamba2.literal.Mamba2LiteralReplay` with its ``math``
replaced by :class:`~replayssm.ops.mamba2.literal.Mamba2Math` with exactly one method wrong; the
validation engine must fail each (the gallery fuzzes them, tests/jobs/test_mutation_gallery.py).  The family
lists them in ``Mamba2.mutants``; the mutant registry registers them
(``validators/engine/mutants/family_mutants.py``).

* :class:`ReadoutWithoutSkip`: the readout drops the skip term ``D x`` (outputs wrong, state right).
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.mamba2.literal import Mamba2Math


class _NoSkipMath(Mamba2Math):
    def window(self, s0, hist, win, params, mode, options, conv=DEFAULT):
        return super().window(s0, hist, win, {**params, "D": torch.zeros_like(params["D"])}, mode, options, conv)


class ReadoutWithoutSkip:
    """The readout drops the skip term: y = C . S instead of C . S + D x (outputs wrong, the state
    and the checkpoint right)."""

    math = _NoSkipMath()
