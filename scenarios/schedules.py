"""Acceptance schedules: how many window tokens each row accepts at each step, and when slots reset.

Oracle: the cursor rules of docs/recurrences.md sections 2-4 (``DecodeConfig``): a schedule simulates each row's
``write_pos`` to decide which phase the next verify lands in.  Every plan is a pure function of
the scenario (numpy's Philox keyed by the scenario seed), so the same JSON gives the same plan.

Schedules (``plan(sc)`` returns a list of :class:`StepPlan`):

* ``exhaustive``: speculative: every accepted count k in 1..T' at every reachable ``write_pos``
  (empty ring, mid, last non-flush, every flush verify; the ring wraps, origins != 0), found by a
  greedy walk over the cursor graph, with resets to revisit the empty ring; each row walks with
  its own k preference order, so rows sit in different phases.  Standard: two full buffers,
  then a reset half way through the third, then one more flush.
* ``random``: one k in 1..T' per step for all rows (``k_weights`` optional, one weight per k);
* ``per-row``: an independent k per row and step (``k_weights`` optional);
* ``always-1``, ``always-T``: k = 1, k = T'; ``fixed``: k = ``schedule_params["k"]`` (1..T');
* ``slot-reuse``: per-row random k, and each row is reset (re-admitted with a new ring origin and
  a new initial state, as after preemption) with probability ``reset_prob`` (default 0.1) per step;
* ``explicit``: the plan written out (what the fuzzer draws and shrinks): ``accepted`` one list per
  step of one k per row (0 for padding rows, 1 in standard decode), optional ``resets`` a list of
  ``[step, row, origin]`` (row re-admitted before that step's verify, at that ring origin);
* ``long``: per-row random k over a long run (default 4,096 steps; set ``steps`` for >= 1e5
  tokens on a GPU);
* ``zero-accept``: per-row k in 0..T' where k = 0 (every draft rejected, bonus token included:
  constrained decoding) has probability ``zero_prob`` (default 0.3); speculative decode only;
* ``ragged``: per-row window lengths T'_r in 1..T' (T'_r = 1: the request drafts nothing this
  step) and k in 1..T'_r (0..T'_r with ``zero_prob``): one verify with a different window per row;
* ``mixed``: drafting switched off and on: runs of standard steps (one-token verifies committed
  with k = 1 on the speculative kernel object; a new run starts with probability ``switch_prob``,
  default 0.3, per step) between speculative steps with per-row random k; speculative decode, for
  kernels declaring ``supports_mixed_decode``.

Options of every schedule (``schedule_params``): ``permute_rows`` (true: the batch row of each
slot is permuted at every step, as a server reorders its batch; the engine un-permutes the
outputs), ``poison`` (``"nan"`` | ``"large"``: before a mid-run reset the recycled slot's
previous checkpoint and records are overwritten with NaN or with 2^100, so a kernel reading its
previous tenant's storage cannot hide it; ``"none"``, the default, leaves them) and ``layout``
(``"padded"``, the default, ``[R, T', ...]`` inputs; ``"packed"``: the tokens back to back with
``query_start_loc``, for kernels declaring ``supports_packed_layout``; ``"views"``: the padded
layout handed over as strided views of wider buffers, ``slot_ids`` a column of a block table,
``out`` a view with canaries in its gaps, for kernels declaring ``supports_strided_views``:
validators/engine/engine_views.py), ``publish`` (a probability: after each commit every active row
publishes its state after a prefix of its committed history into an unused slot with
``materialize``, for kernels declaring ``supports_materialize``; the ``materialize`` check).

Standard decode accepts k = 1 always.  Padding rows get k = 0 in the plan (the engine hands the
kernel garbage there: kernels must ignore it).  The
explicit schedule may also give ``window_lens`` (one list per step of one T'_r per row, 0 for
padding rows), k = 0 for active rows (speculative decode) and ``standard_steps`` (the steps that
are standard steps on the speculative slots: every active row k = 1, no ``window_lens`` there).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from replayssm.interface import PAD_SLOT


@dataclass(frozen=True)
class StepPlan:
    """One step: ``accepted[r]`` tokens committed by row r (0 for padding rows); rows in
    ``reset_rows`` are reset before the verify, at ring origins ``reset_origins`` (same order)."""

    step: int
    accepted: list[int]
    reset_rows: list[int] = field(default_factory=list)
    reset_origins: list[int] = field(default_factory=list)
    window_lens: list[int] | None = None  # T'_r per row (0 for padding rows); None: T' for every row
    standard: bool = False  # a standard step (one-token verify) on the speculative slots
    layout: str = "padded"  # "padded" [R, T', ...] | "packed" (query_start_loc) | "views" (strided views)
    perm: list[int] | None = None  # batch row i of this step's kernel calls is scenario row perm[i]
    poison: str = "none"  # what the recycled slots of this step's resets are filled with first
    # The reset rows are re-admitted through the interface's defaults: ``reset(slot_ids, None, None)``
    # (zeros; origin 0 where every reset origin is 0, else the origins), judged against zeros.
    reset_default: bool = False


_DEFAULT_STEPS = {"random": 64, "per-row": 64, "always-1": 32, "always-T": 32, "fixed": 32, "slot-reuse": 96,
                  "long": 4096, "zero-accept": 48, "ragged": 48, "mixed": 48}
POISONS = ("none", "nan", "large")
LAYOUTS = ("padded", "packed", "views")
POISON_LARGE = 2.0 ** 100
_COMMON = {"permute_rows", "poison", "layout", "publish"}
_PARAMS = {
    "exhaustive": set(),
    "random": {"k_weights"},
    "per-row": {"k_weights"},
    "always-1": set(),
    "always-T": set(),
    "fixed": {"k"},
    "explicit": {"accepted", "resets", "window_lens", "standard_steps"},
    "slot-reuse": {"k_weights", "reset_prob"},
    "long": {"k_weights"},
    "zero-accept": {"zero_prob"},
    "ragged": {"zero_prob"},
    "mixed": {"switch_prob"},
}
_PARAMS = {k: v | _COMMON for k, v in _PARAMS.items()}
SCHEDULES = {
    "exhaustive": "every k in 1..T' at every ring phase (empty, mid, last non-flush, flush, wrap)",
    "random": "one random k per step, shared by all rows",
    "per-row": "an independent random k per row",
    "always-1": "k = 1 (every draft rejected)",
    "always-T": "k = T' (every draft accepted)",
    "fixed": "k = schedule_params['k'] at every step",
    "explicit": "the plan written out: schedule_params accepted[step][row], resets [[step, row, origin]]",
    "slot-reuse": "per-row random k; rows reset mid-run with new origins (preemption)",
    "long": "per-row random k over a long run",
    "zero-accept": "per-row k in 0..T' (k = 0 with probability zero_prob: every draft rejected)",
    "ragged": "per-row window lengths T'_r in 1..T' and k in 1..T'_r (one verify, a window per row)",
    "mixed": "runs of standard steps (drafting off) between speculative steps on the same slots",
}


def _fail(msg: str) -> ValueError:
    return ValueError(f"scenario.schedule_params: {msg}")


def check_schedule_params(sc) -> None:
    """Raise ValueError naming ``scenario.schedule_params`` when a parameter is unknown or bad."""
    p = sc.schedule_params
    unknown = set(p) - _PARAMS[sc.schedule]
    if unknown:
        raise _fail(f"unknown parameter(s) {sorted(unknown)} for schedule {sc.schedule!r}; "
                    f"expected a subset of {sorted(_PARAMS[sc.schedule])}")
    if "k_weights" in p:
        w = p["k_weights"]
        if (not isinstance(w, list) or len(w) != sc.window
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                           for x in w)
                or sum(w) <= 0):
            raise _fail(f"k_weights: expected {sc.window} finite non-negative numbers (one per k = 1..T') with "
                        f"a positive sum, got {w!r}")
    if sc.schedule == "fixed":
        k = p.get("k")
        T = sc.window
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= T:
            raise _fail(f"k: expected an accepted count 1 <= k <= T' = {T}, got {k!r}")
    if sc.schedule == "explicit":
        _check_explicit(sc, p)
    if "zero_prob" in p:
        q = p["zero_prob"]
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
            raise _fail(f"zero_prob: expected a probability in [0, 1], got {q!r}")
    if sc.schedule == "zero-accept" and sc.decode != "speculative":
        raise ValueError("scenario.schedule: 'zero-accept' needs speculative decode (standard decode commits "
                         "exactly 1 token)")
    if "permute_rows" in p and not isinstance(p["permute_rows"], bool):
        raise _fail(f"permute_rows: expected true or false, got {p['permute_rows']!r}")
    if "poison" in p and p["poison"] not in POISONS:
        raise _fail(f"poison: expected one of {POISONS}, got {p['poison']!r}")
    if "layout" in p and p["layout"] not in LAYOUTS:
        raise _fail(f"layout: expected one of {LAYOUTS}, got {p['layout']!r}")
    if "publish" in p:
        q = p["publish"]
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 < q <= 1.0:
            raise _fail(f"publish: expected a probability in (0, 1], got {q!r}")
    if "switch_prob" in p:
        q = p["switch_prob"]
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
            raise _fail(f"switch_prob: expected a probability in [0, 1], got {q!r}")
    if sc.schedule == "mixed" and sc.decode != "speculative":
        raise ValueError("scenario.schedule: 'mixed' needs speculative decode (standard steps on speculative slots)")
    if "reset_prob" in p:
        q = p["reset_prob"]
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 < q <= 1.0:
            raise _fail(f"reset_prob: expected a probability in (0, 1], got {q!r}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_explicit(sc, p: dict) -> None:
    """Every entry of an explicit plan, named by its path (``accepted[3][1]``, ``resets[0]``)."""
    acc = p.get("accepted")
    if not isinstance(acc, list) or not acc:
        raise _fail(f"accepted: expected a non-empty list (one entry per step) of lists of {sc.rows} accepted "
                    f"counts, got {type(acc).__name__} {acc!r}"[:300])
    ids = sc.resolved_slot_ids
    T = sc.window if sc.decode == "speculative" else 1
    lo = 0 if sc.decode == "speculative" else 1
    wls = p.get("window_lens")
    if wls is not None:
        if not isinstance(wls, list) or len(wls) != len(acc):
            raise _fail(f"window_lens: expected one list of {sc.rows} window lengths per step ({len(acc)} steps), "
                        f"got {wls!r}"[:300])
        for s, row in enumerate(wls):
            if not isinstance(row, list) or len(row) != sc.rows:
                raise _fail(f"window_lens[{s}]: expected a list of {sc.rows} window lengths, got {row!r}")
            for r, n in enumerate(row):
                if ids[r] == PAD_SLOT:
                    if n != 0 or not _is_int(n):
                        raise _fail(f"window_lens[{s}][{r}]: row {r} is a padding row, expected 0, got {n!r}")
                elif not _is_int(n) or not 1 <= n <= T:
                    raise _fail(f"window_lens[{s}][{r}]: expected a window length 1 <= T'_r <= T'max = {T}, "
                                f"got {n!r}")
    for s, row in enumerate(acc):
        if not isinstance(row, list) or len(row) != sc.rows:
            raise _fail(f"accepted[{s}]: expected a list of {sc.rows} accepted counts (one per row), got {row!r}")
        for r, k in enumerate(row):
            if ids[r] == PAD_SLOT:
                if k != 0 or not _is_int(k):
                    raise _fail(f"accepted[{s}][{r}]: row {r} is a padding row, expected 0, got {k!r}")
                continue
            hi = T if wls is None else wls[s][r]
            if not _is_int(k) or not lo <= k <= hi:
                what = f"T' = {T}" if wls is None else f"window_lens[{s}][{r}] = {hi}"
                raise _fail(f"accepted[{s}][{r}]: expected an accepted count {lo} <= k <= {what}"
                            + (" (standard decode)" if lo else "") + f", got {k!r}")
    std = p.get("standard_steps")
    if std is not None:
        if sc.decode != "speculative":
            raise _fail("standard_steps: standard steps on speculative slots need speculative decode")
        if not isinstance(std, list) or not all(_is_int(x) for x in std) or len(set(std)) != len(std):
            raise _fail(f"standard_steps: expected a list of distinct step indices, got {std!r}"[:300])
        for i, st in enumerate(std):
            if not 0 <= st < len(acc):
                raise _fail(f"standard_steps[{i}]: expected a step in [0, {len(acc)}), got {st}")
            bad = [r for r in range(sc.rows) if ids[r] != PAD_SLOT and acc[st][r] != 1]
            if bad:
                raise _fail(f"accepted[{st}][{bad[0]}]: step {st} is a standard step, expected k = 1, "
                            f"got {acc[st][bad[0]]!r}")
            if wls is not None and any(wls[st][r] != 1 for r in range(sc.rows) if ids[r] != PAD_SLOT):
                raise _fail(f"window_lens[{st}]: step {st} is a standard step, expected window length 1 per active "
                            f"row, got {wls[st]!r}")
    if sc.steps is not None and sc.steps > len(acc):
        raise ValueError(f"scenario.steps: the explicit plan has {len(acc)} steps, got steps = {sc.steps}")
    resets = p.get("resets", [])
    if not isinstance(resets, list):
        raise _fail(f"resets: expected a list of [step, row, origin] entries, got {type(resets).__name__}")
    ring = sc.ring_rows if sc.decode == "speculative" else 1
    seen = set()
    for i, e in enumerate(resets):
        if not isinstance(e, list) or len(e) != 3 or not all(_is_int(x) for x in e):
            raise _fail(f"resets[{i}]: expected [step, row, origin] (three integers), got {e!r}")
        step, r, o = e
        if not 1 <= step < len(acc):
            raise _fail(f"resets[{i}]: step expected in [1, {len(acc)}) (a reset before a later verify), got {step}")
        if not 0 <= r < sc.rows or ids[r] == PAD_SLOT:
            raise _fail(f"resets[{i}]: row expected an active row of {list(ids)}, got {r}")
        if not 0 <= o < ring:
            raise _fail(f"resets[{i}]: origin expected in [0, {ring}) (0 in standard decode), got {o}")
        if (step, r) in seen:
            raise _fail(f"resets[{i}]: row {r} is reset twice before step {step}")
        seen.add((step, r))


def default_steps(sc) -> int:
    """The plan length when ``sc.steps`` is None."""
    if sc.schedule == "exhaustive":
        return len(_exhaustive(sc))
    if sc.schedule == "explicit":
        return len(sc.schedule_params["accepted"])
    return _DEFAULT_STEPS[sc.schedule]


def _rng(sc, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=[sc.seed & 0xFFFFFFFFFFFFFFFF, stream]))


def _draw_k(rng: np.random.Generator, sc, n: int) -> np.ndarray:
    T = sc.window
    w = sc.schedule_params.get("k_weights")
    if w is None:
        return rng.integers(1, T + 1, size=n)
    p = np.asarray(w, dtype=np.float64)
    return rng.choice(np.arange(1, T + 1), size=n, p=p / p.sum())


def _cover_walk(sc, order: list[int]) -> tuple[list[int], list[int]]:
    """Accepted counts covering every (write_pos, k) pair reachable from an empty ring, and the
    step indices before which the row is reset (to reach write_pos = 0 again)."""
    dec = sc.decode_config
    T, hi = sc.window, dec.max_write_pos()
    nxt = lambda w, k: dec.commit_cursor(w, 0, dec.is_flush(w), k)[0]
    todo = {(w, k) for w in range(hi + 1) for k in range(1, T + 1)}
    w, ks, resets = 0, [], []
    while todo:
        cand = [k for k in order if (w, k) in todo]
        if cand:
            fresh = [k for k in cand if any((nxt(w, k), j) in todo for j in range(1, T + 1))]
            k = (fresh or cand)[0]
            todo.discard((w, k))
            ks.append(k)
            w = nxt(w, k)
            continue
        # Nearest write_pos with uncovered pairs, by the cursor graph (write_pos 0 only by reset).
        seen, queue, first = {w}, deque([w]), {w: None}
        target = None
        while queue and target is None:
            v = queue.popleft()
            for k in order:
                u = nxt(v, k)
                if u not in seen:
                    seen.add(u)
                    first[u] = k if first[v] is None else first[v]
                    if any((u, j) in todo for j in range(1, T + 1)):
                        target = u
                        break
                    queue.append(u)
        if target is None:
            resets.append(len(ks))
            w = 0
            continue
        k = first[target]
        ks.append(k)
        w = nxt(w, k)
    return ks, resets


def _until_wrap(sc, ks: list[int], resets: list[int], origin: int, reset_origin: int) -> list[int]:
    """``ks`` extended with k = T' until some step wraps the ring (the origin moves past its last row)."""
    dec = sc.decode_config
    ks = list(ks)
    if not dec.uses_ring:
        return ks
    w, o, s = 0, origin, 0
    while True:
        if s in resets:
            w, o = 0, reset_origin
        if s == len(ks):
            ks.append(sc.window)
        nw, no = dec.commit_cursor(w, o, dec.is_flush(w), ks[s])
        if no < o:
            return ks
        w, o = nw, no
        s += 1


def _exhaustive(sc) -> list[StepPlan]:
    ids = sc.resolved_slot_ids
    rows = len(ids)
    ring = sc.ring_rows
    if sc.decode == "standard":
        L = sc.buffer
        n = 2 * L + L // 2 + L
        reset_at = 2 * L + L // 2
        plans = []
        for s in range(n):
            acc = [0 if i == PAD_SLOT else 1 for i in ids]
            rr = [r for r, i in enumerate(ids) if i != PAD_SLOT] if s == reset_at else []
            plans.append(StepPlan(s, acc, rr, [0] * len(rr)))
        return plans
    T = sc.window
    walks, covers = {}, {}
    for r, i in enumerate(ids):
        if i == PAD_SLOT:
            continue
        shift = r % T
        if shift not in covers:  # a walk depends on the order only: at most T' distinct ones
            covers[shift] = _cover_walk(sc, [((j + shift) % T) + 1 for j in range(T)])
        ks, resets = covers[shift]
        walks[r] = (_until_wrap(sc, ks, resets, sc.resolved_origins[r], (ring - 1 - r) % ring), resets)
    n = max(len(ks) for ks, _ in walks.values())
    rng = _rng(sc, 1)
    fill = _draw_k(rng, sc, n * rows).reshape(n, rows) if rows else None
    plans = []
    for s in range(n):
        acc, rr, ro = [], [], []
        for r in range(rows):
            if r not in walks:
                acc.append(0)
                continue
            ks, resets = walks[r]
            acc.append(int(ks[s]) if s < len(ks) else int(fill[s, r]))
            if s in resets:
                rr.append(r)
                ro.append((ring - 1 - r) % ring)
        plans.append(StepPlan(s, acc, rr, ro))
    return plans


def _explicit(sc) -> list[StepPlan]:
    acc = sc.schedule_params["accepted"]
    n = len(acc) if sc.steps is None else sc.steps
    resets: dict[int, list[tuple[int, int]]] = {}
    for step, r, o in sc.schedule_params.get("resets", []):
        resets.setdefault(step, []).append((r, o))
    wls = sc.schedule_params.get("window_lens")
    std = set(sc.schedule_params.get("standard_steps", []))
    plans = []
    for s in range(n):
        rr = sorted(resets.get(s, []))
        plans.append(StepPlan(s, [int(k) for k in acc[s]], [r for r, _ in rr], [o for _, o in rr],
                              window_lens=None if wls is None or s in std else [int(x) for x in wls[s]],
                              standard=s in std))
    return plans


def _with_options(sc, plans: list[StepPlan]) -> list[StepPlan]:
    """The schedule options every schedule takes: per-step row permutations, recycled-slot poison."""
    p = sc.schedule_params
    poison = p.get("poison", "none")
    rng = _rng(sc, 4)
    out = []
    for pl in plans:
        perm = [int(i) for i in rng.permutation(sc.rows)] if p.get("permute_rows") else None
        out.append(replace(pl, perm=perm, poison=poison, layout=p.get("layout", "padded")))
    return out


def plan(sc) -> list[StepPlan]:
    """The step plan of scenario ``sc`` (``sc.steps`` steps, or the schedule's own length)."""
    return _with_options(sc, _plan(sc))


def _plan(sc) -> list[StepPlan]:
    ids = sc.resolved_slot_ids
    rows = len(ids)
    active = [r for r, i in enumerate(ids) if i != PAD_SLOT]
    name = sc.schedule
    if name == "exhaustive":
        base = _exhaustive(sc)
        n = len(base) if sc.steps is None else sc.steps
        out = []
        for s in range(n):
            b = base[s % len(base)]
            # Cycling the cover walk: every cycle starts from an empty ring again.
            rr, ro = list(b.reset_rows), list(b.reset_origins)
            if s and s % len(base) == 0:
                extra = [r for r in active if r not in rr]
                rr += extra
                ro += [sc.resolved_origins[r] for r in extra]
            # Every re-admission of the cover walk goes through the documented defaults of reset
            # (initial_state=None: zeros), the path a kernel keeping the old state there fails.
            out.append(StepPlan(s, list(b.accepted), rr, ro, reset_default=bool(rr)))
        return out
    if name == "explicit":
        return _explicit(sc)
    n = sc.steps if sc.steps is not None else _DEFAULT_STEPS[name]
    T = sc.window if sc.decode == "speculative" else 1
    rng = _rng(sc, 2)
    if name == "zero-accept":
        ks = rng.integers(1, T + 1, size=(n, rows))
    elif T == 1 or name == "always-1":
        ks = np.ones((n, rows), dtype=np.int64)
    elif name == "always-T":
        ks = np.full((n, rows), T, dtype=np.int64)
    elif name == "fixed":
        ks = np.full((n, rows), sc.schedule_params["k"], dtype=np.int64)
    elif name == "random":
        ks = np.repeat(_draw_k(rng, sc, n)[:, None], rows, axis=1)
    else:
        ks = _draw_k(rng, sc, n * rows).reshape(n, rows)
    resets = np.zeros((n, rows), dtype=bool)
    origins = np.zeros((n, rows), dtype=np.int64)
    if name == "slot-reuse":
        q = float(sc.schedule_params.get("reset_prob", 0.1))
        rr = _rng(sc, 3)
        resets = rr.random((n, rows)) < q
        resets[0] = False
        if sc.decode == "speculative":
            origins = rr.integers(0, sc.ring_rows, size=(n, rows))
    wls = None
    if name == "ragged":
        wls = rng.integers(1, T + 1, size=(n, rows))
        # k uniform in 1..T'_r
        ks = 1 + np.floor(rng.random((n, rows)) * wls).astype(np.int64)
    if name in ("zero-accept", "ragged") and sc.decode == "speculative":
        q = float(sc.schedule_params.get("zero_prob", 0.3 if name == "zero-accept" else 0.0))
        ks = np.where(_rng(sc, 5).random((n, rows)) < q, 0, ks)
    std = np.zeros(n, dtype=bool)
    if name == "mixed":
        q = float(sc.schedule_params.get("switch_prob", 0.3))
        flips = _rng(sc, 6).random(n) < q
        on = False
        for s in range(n):
            on = on != bool(flips[s])
            std[s] = on
        ks[std] = 1
    plans = []
    for s in range(n):
        acc = [int(ks[s, r]) if r in active else 0 for r in range(rows)]
        rr_s = [r for r in active if resets[s, r]]
        wl = None if wls is None else [int(wls[s, r]) if r in active else 0 for r in range(rows)]
        plans.append(StepPlan(s, acc, rr_s, [int(origins[s, r]) for r in rr_s], window_lens=wl,
                              standard=bool(std[s])))
    return plans


__all__ = ["LAYOUTS", "POISONS", "POISON_LARGE", "SCHEDULES", "StepPlan", "check_schedule_params", "default_steps",
           "plan"]
