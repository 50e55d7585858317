"""The two tiers of the GPU-marked tests (issue 18 item 4).

* **Merge tier** (``nox -s gpu``: ``-m "gpu and not slow and not bench"``), run on every merge and
  meant to finish within 10 minutes on one H200: every kernel and decode kind at its serving
  geometry, in one precision mode per kind of state storage (:data:`MERGE_MODES`: an fp32 state
  with bf16 activations, a 16-bit state with stochastic rounding, a scaled 8-bit state, a
  tensor-core readout), the smallest and the largest batch (1 and 512), the exhaustive
  speculative schedule once per family, the shortest and the default buffer, and every
  bit-identity and golden test.
* **Slow GPU tier** (``nox -s gpu_slow``: ``-m "gpu and slow and not bench"``): the same tests in
  the other modes, batch sizes, buffer lengths and geometries.  It shards with pytest-split
  (``nox -s gpu_slow -- --splits 4 --group 2``), by the durations in ``.test_durations`` when that
  file is there (``--store-durations`` writes it), by test count otherwise.

The tiers select parameters, never weaken one: a case runs the same checks in either tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest

MERGE_MODES = frozenset({"s32a16", "s16a16-sr", "sfp8a16-sr", "s32a32-tf32"})


def in_merge_tier(mode: str) -> bool:
    """Whether a precision mode is one the merge tier runs (the others: the slow GPU tier)."""
    return mode in MERGE_MODES


def scenario_in_merge_tier(sc, serving_geometry: str) -> bool:
    """The rule for an engine case ``sc`` of a family's GPU suite: a merge mode; the shortest or the
    default buffer; the exhaustive schedule on the automatic path only; on a geometry other than the
    family's serving one, one mode (s32a16)."""
    if not in_merge_tier(sc.mode) or (sc.decode == "standard" and sc.buffer not in (1, 16)):
        return False
    if sc.schedule == "exhaustive" and sc.kernel_options.get("prepass"):
        return False
    return sc.geometry == serving_geometry or sc.mode == "s32a16"


def tiered(values: Iterable, merge: Callable[..., bool], ids: Sequence[str] | None = None) -> list:
    """``values`` as pytest params, those for which ``merge(value)`` is false marked ``slow``
    (the slow GPU tier).  A tuple value is one parameter set (unpacked into the params)."""
    out = []
    for i, v in enumerate(values):
        args = v if isinstance(v, tuple) else (v,)
        marks = () if merge(v) else (pytest.mark.slow,)
        out.append(pytest.param(*args, marks=marks, id=None if ids is None else ids[i]))
    return out
