"""Static shards: ``--shard auto`` from the environment, and cells assigned by estimated cost.

Oracle: the partition property (every cell in exactly one shard, the same assignment in every
process: it depends on the sweep configuration only) and the longest-processing-time-first bound
(no shard's load exceeds the mean load by more than the largest cell's cost; tests/jobs/test_scaleout.py).

Cost model (:func:`cell_cost`, arbitrary units, device-independent so that every shard computes
the same assignment): accepted tokens x rows x state elements of the family's geometry, times

* ``SPECULATIVE_FACTOR`` = 2.5 for a speculative schedule (alone on an H100, 8 rows: 18,090-18,966
  against 45,246-48,696 validated tokens/s for standard decode, rec:8c86bd2733d4d900 and the three
  other drift-rate records of commit 041a19a0; :func:`drift.dispatch_order`);
* ``EAGER_FACTOR`` = 14 for a kernel that cannot be driven through its raw launch path (no CUDA
  graphs on a GPU, the per-step path on any device: an eager adapter cell runs an order of magnitude
  slower than a graphed one, issue 54; unrecorded).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from replayssm.families import preset
from replayssm.registry import get
from replayssm.validators.jobs.drift.fast import raw_path

SPECULATIVE_FACTOR = 2.5
EAGER_FACTOR = 14.0

# (index variable, count variable, offset variable or None, step variable or None, what sets them)
_SOURCES = (
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
     "a Slurm job array"),
    ("BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT", None, None, "Buildkite parallelism"),
)
SHARD_ENV = "REPLAYSSM_SHARD"  # i/n, set by a workflow (a GitHub matrix: REPLAYSSM_SHARD: ${{ matrix.shard }}/4)


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"--shard auto: {name}={env[name]!r} is not an integer") from None


def shard_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(i, n)`` from ``REPLAYSSM_SHARD=i/n``, a Slurm array (``SLURM_ARRAY_TASK_ID`` and
    ``_COUNT``, offset by ``_MIN`` and divided by ``_STEP`` when set) or Buildkite parallelism
    (``BUILDKITE_PARALLEL_JOB`` and ``_COUNT``).  Every source set must agree; none set, half a
    pair, or an index outside ``0 <= i < n`` is a ``ValueError`` naming ``--shard auto``."""
    env = os.environ if env is None else env
    found: list[tuple[tuple[int, int], str]] = []
    if env.get(SHARD_ENV):
        text = env[SHARD_ENV]
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ValueError(f"--shard auto: {SHARD_ENV}={text!r} is not i/n (e.g. 0/4)") from None
        found.append(((i, n), f"{SHARD_ENV}={text}"))
    for idx, cnt, lo, step, what in _SOURCES:
        have = [v for v in (idx, cnt) if env.get(v, "") != ""]
        if not have:
            continue
        if len(have) == 1:
            missing = cnt if have == [idx] else idx
            raise ValueError(f"--shard auto: {have[0]} is set but {missing} is not ({what})")
        i, n = _int(env, idx), _int(env, cnt)
        if lo and env.get(lo, "") != "":
            i -= _int(env, lo)
        if step and env.get(step, "") not in ("", "1"):
            s = _int(env, step)
            if s < 1 or i % s:
                raise ValueError(f"--shard auto: {idx}={env[idx]} is not on the array's step {step}={s}")
            i //= s
        found.append(((i, n), f"{idx}={env[idx]} {cnt}={env[cnt]} ({what})"))
    if not found:
        raise ValueError(f"--shard auto: none of {SHARD_ENV}, SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, "
                         f"BUILDKITE_PARALLEL_JOB/BUILDKITE_PARALLEL_JOB_COUNT is set; give --shard i/n")
    (i, n), why = found[0]
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard auto: {why} gives shard {i} of {n}; expected 0 <= i < n")
    for other, why2 in found[1:]:
        if other != (i, n):
            raise ValueError(f"--shard auto: the environment disagrees: {why} gives {i}/{n}, "
                             f"{why2} gives {other[0]}/{other[1]}")
    return i, n


def eager(spec) -> bool:
    """Whether ``spec``'s kernel lacks the raw launch path (:func:`drift_fast.raw_path`): such a cell
    runs eagerly (no CUDA graphs), about 14x slower per token."""
    cls = get(spec.kernel, spec.family)
    try:
        return not raw_path(cls.__new__(cls))
    except Exception:  # noqa: BLE001 - a class that cannot be looked at without its constructor: assume eager
        return True


def cell_cost(spec, cfg) -> float:
    """The estimated cost of ``spec`` in ``cfg`` (the module docstring's model)."""
    geo = preset(dict(cfg.geometry)[spec.family], spec.family)
    cost = float(cfg.tokens) * cfg.rows * math.prod(geo.state_shape)
    if spec.speculative:
        cost *= SPECULATIVE_FACTOR
    if eager(spec):
        cost *= EAGER_FACTOR
    return cost


def longest_first(cells: list, cfg) -> list:
    """``cells`` by estimated cost, largest first (ties: by id): the order a dynamic scheduler takes them in."""
    return sorted(cells, key=lambda c: (-cell_cost(c, cfg), c.id))


def partition(items: list, n: int, cost, key) -> list[list]:
    """``items`` in ``n`` parts by longest-processing-time-first: each item, largest ``cost(item)``
    first (ties: by ``key(item)``), to the part with the least load so far (ties: the lowest index).
    Each part in ``key`` order.  A function of the items only, so every process agrees."""
    if n < 1:
        raise ValueError(f"shard: expected n >= 1, got {n}")
    loads, parts = [0.0] * n, [[] for _ in range(n)]
    for c in sorted(items, key=lambda c: (-cost(c), key(c))):
        j = min(range(n), key=lambda k: (loads[k], k))
        parts[j].append(c)
        loads[j] += cost(c)
    return [sorted(p, key=key) for p in parts]


def balanced_shards(cells: list, n: int, cfg) -> list[list]:
    """``cells`` in ``n`` shards by estimated cost (:func:`partition`, ties and order by id): a
    function of the cells and the configuration only, so every shard agrees."""
    return partition(cells, n, lambda c: cell_cost(c, cfg), lambda c: c.id)


def shard_of(cells: list, shard: tuple[int, int], cfg) -> list:
    """Shard ``i`` of ``n`` (:func:`balanced_shards`)."""
    i, n = shard
    return balanced_shards(cells, n, cfg)[i]


__all__ = ["EAGER_FACTOR", "SHARD_ENV", "SPECULATIVE_FACTOR", "balanced_shards", "cell_cost", "eager",
           "longest_first", "partition", "shard_from_env", "shard_of"]
