"""The two tiers of the GPU-marked tests (issue 18 item 4).

* **Merge tier** (``nox -s gpu``: ``-m "gpu and not slow and not bench"``), run on every merge and
  meant to finish within 10 minutes on one H200: every kernel, decode kind and path (fused and
  pre-pass) at the family's serving geometry in :data:`FULL_MODE` (an fp32 state with bf16
  activations); each other :data:`MERGE_MODES` mode (one per kind of state storage: a 16-bit state
  with stochastic rounding, a scaled 8-bit state, a tensor-core readout) on the automatic path and
  the speculative decode (verify, commit, fold and store all run there; a tensor-core readout on
  the decode its suite gives it); another geometry in the speculative decode of FULL_MODE; the
  smallest and the largest batch (1 and 512), the exhaustive speculative schedule once per family,
  the shortest and the default buffer, and every bit-identity and golden test.  Why it was cut to
  this: the earlier merge tier (every kernel and decode in all four modes) ran past 560 s with 124
  of its 133 tests done on one H200 (the gpu-merge-tier profile).
* **Slow GPU tier** (``nox -s gpu_slow``: ``-m "gpu and slow and not bench"``): the same tests in
  the other modes, batch sizes, buffer lengths and geometries.  It shards with pytest-split
  (``nox -s gpu_slow -- --splits 4 --group 2``), by the durations in ``.test_durations`` when that
  file is there (``--store-durations`` writes it), by test count otherwise.

Both sessions run pytest-xdist workers on the one GPU (``REPLAYSSM_GPU_WORKERS``, default 4: the
tests are mostly host work, the engine's checks and the literal model), with ``--dist loadgroup``;
the tests that hold tens of GB of GPU memory (batch 512 at a serving geometry) carry
:data:`BIG_MEMORY`, one xdist group, so they run one at a time on one worker.

The tiers select parameters, never weaken one: a case runs the same checks in either tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest

MERGE_MODES = frozenset({"s32a16", "s16a16-sr", "sfp8a16-sr", "s32a32-tf32"})
FULL_MODE = "s32a16"
BIG_MEMORY = pytest.mark.xdist_group("gpu-big-memory")


def in_merge_tier(mode: str) -> bool:
    """Whether a precision mode is one the merge tier runs (the others: the slow GPU tier)."""
    return mode in MERGE_MODES


def scenario_in_merge_tier(sc, serving_geometry: str) -> bool:
    """The rule for an engine case ``sc`` of a family's GPU suite: a merge mode; the shortest or the
    default buffer; the exhaustive schedule on the automatic path only; on a geometry other than the
    family's serving one, the speculative decode of :data:`FULL_MODE`; a merge mode other than
    FULL_MODE on the automatic path, in the speculative decode (a tensor-core readout: any decode)."""
    if not in_merge_tier(sc.mode) or (sc.decode == "standard" and sc.buffer not in (1, 16)):
        return False
    prepass = bool(sc.kernel_options.get("prepass"))
    if sc.schedule == "exhaustive" and prepass:
        return False
    if sc.geometry != serving_geometry:
        return sc.mode == FULL_MODE and sc.decode == "speculative"
    return sc.mode == FULL_MODE or (not prepass and (sc.decode == "speculative" or "tf32" in sc.mode))


def mode_path_in_merge_tier(case) -> bool:
    """The rule for a ``(mode, path)`` case: every path of FULL_MODE, the automatic one of the others."""
    mode, path = case
    return in_merge_tier(mode) and (mode == FULL_MODE or path != "prepass")


def tiered(values: Iterable, merge: Callable[..., bool], ids: Sequence[str] | None = None,
           marks: Callable[..., Sequence] | None = None) -> list:
    """``values`` as pytest params, those for which ``merge(value)`` is false marked ``slow``
    (the slow GPU tier); ``marks(value)``: more marks for a value (:data:`BIG_MEMORY`).  A tuple
    value is one parameter set (unpacked into the params)."""
    out = []
    for i, v in enumerate(values):
        args = v if isinstance(v, tuple) else (v,)
        extra = tuple(marks(v)) if marks is not None else ()
        tier = () if merge(v) else (pytest.mark.slow,)
        out.append(pytest.param(*args, marks=tier + extra, id=None if ids is None else ids[i]))
    return out
