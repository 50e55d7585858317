"""Hypothesis strategies over validation scenarios: public and composable.

Oracle: none here; these only *draw* :class:`~replayssm.scenarios.scenario.Scenario` values.
Every drawn scenario is valid (the Scenario constructor checks it) and fully replayable: the
acceptance plan is written out in the ``explicit`` schedule, so shrinking a failure shrinks the
steps, rows and accepted counts themselves, and the shrunk scenario's JSON replays it exactly.

Building blocks (each a strategy, usable alone in a kernel author's own ``@given``):

* :func:`geometries` small custom geometries (powers of two, several heads per group) or ``tiny``;
* :func:`decode_configs` ``(decode, T', buffer)``: speculative T' in 1..4 with B in T'..T'+8, or
  standard L in 1..8 (half the draws take the smallest buffers: frequent flushes);
* :func:`precision_modes` mode ids, filtered to what a kernel supports;
* :func:`batch_layouts` rows, padding rows, slot ids (unused slots stay canaries), ring origins;
* :func:`accepted_plans` accepted counts per step and row (short plans, or long ones for
  accumulated error), plus mid-run slot reuse (resets);
* :func:`distributions` input regimes, from mild to extreme-but-finite (``near-fp16-limit``,
  ``heavy-tailed``, ``large-delta``);
* :func:`serving_options` what a serving engine does to a plan, each only where the kernel
  declares it (drawn last, each behind a boolean, so shrinking drops what a failure does not
  need): ragged windows (``window_lens``, with k <= T'_r), rows accepting nothing (k = 0, for
  ``zero_accept = "noop"``), the batch permuted every step, recycled slots poisoned (NaN or 2^100),
  the packed layout (``query_start_loc``), standard steps on speculative slots (drafting off);
* :func:`scenarios` all of the above (initial states: random, zeros, or an fp64 prefill's) into one
  Scenario, optionally for one registered kernel.

Example::

    from hypothesis import given
    from replayssm.scenarios.strategies import scenarios
    from replayssm.validators.jobs.fuzz.run import check_scenario

    @given(scenarios(kernel=MyKernel))
    def test_my_kernel(sc):
        check_scenario(sc, MyKernel)
"""

from __future__ import annotations

from functools import cache

from hypothesis import reject
from hypothesis import strategies as st

from replayssm.families import family as family_of
from replayssm.families import family_names, geometry_from_dict, preset
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelUnderTest, geometry_reason, policy
from replayssm.precision import STANDARD_MODES, PrecisionMode, parse_mode
from replayssm.registry import get
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import POISONS

# Modes drawn by default: the standard sweep (reference first) plus readout and seed variants.
FUZZ_MODES: tuple[str, ...] = ("s32a32", *[m for m in STANDARD_MODES if m != "s32a32"],
                               "s32a16-tf32", "s16a16-sr3", "sfp8a16-sr5", "si8a16-sr")
# Input regimes, the public tests' mild one first (what shrinking falls back to).
FUZZ_DISTRIBUTIONS: tuple[str, ...] = ("mild", *[d for d in DISTRIBUTIONS if d != "mild"])


@cache
def _parsed(mode: str) -> PrecisionMode:
    return parse_mode(mode)


def _mode(mode) -> PrecisionMode:
    """``parse_mode(mode)``, an id parsed once per process (the strategies run at every drawn example)."""
    return _parsed(mode) if isinstance(mode, str) else parse_mode(mode)


def _kernel_class(kernel, family: str | None) -> type[KernelUnderTest] | None:
    if kernel is None:
        return None
    if isinstance(kernel, str):
        if family is None:
            raise ValueError("family: a kernel given by name needs its family")
        return get(kernel, family)
    if isinstance(kernel, type) and issubclass(kernel, KernelUnderTest):
        return kernel
    raise ValueError(f"kernel: expected a registered name or a KernelUnderTest subclass, got {kernel!r}")


def families() -> st.SearchStrategy[str]:
    return st.sampled_from(family_names())


def geometries(family: str, *, presets: tuple[str, ...] = ("tiny",), max_dim: int = 8
               ) -> st.SearchStrategy[str | dict]:
    """Small geometries of ``family``: custom dicts (powers of two up to ``max_dim``, 1-2 groups /
    key heads with 1-2 heads each, so a wrong head-to-group mapping shows) or a preset name."""
    fam = family_of(family)
    dims = [d for d in (1, 2, 4, 8, 16) if d <= max_dim]
    wide = [d for d in dims if d >= 2]
    custom = fam.strategy_geometry(st, dims, wide)
    return st.one_of(custom, st.sampled_from(presets)) if presets else custom


def decode_configs(*, decodes: tuple[str, ...] = ("speculative", "standard"), max_window: int = 4,
                   max_extra_buffer: int = 8, max_standard_buffer: int = 8) -> st.SearchStrategy[DecodeConfig]:
    """Decode settings: speculative T' in 1..max_window with B in T'..T'+max_extra_buffer, or
    standard L in 1..max_standard_buffer."""
    bad = set(decodes) - {"speculative", "standard"}
    if bad or not decodes:
        raise ValueError(f"decodes: expected a non-empty subset of ('speculative', 'standard'), got {decodes!r}")

    # Half the draws take the smallest buffers (a flush every verify or two): drift and rounding
    # bugs need many flushes to show.
    extra = st.one_of(st.just(0), st.integers(0, max_extra_buffer))
    length = st.one_of(st.integers(1, min(2, max_standard_buffer)), st.integers(1, max_standard_buffer))

    @st.composite
    def draw_config(draw):
        decode = draw(st.sampled_from(decodes))
        if decode == "standard":
            return DecodeConfig("standard", 1, draw(length))
        T = draw(st.integers(1, max_window))
        return DecodeConfig("speculative", T, T + draw(extra))

    return draw_config()


def precision_modes(kernel: type[KernelUnderTest] | None = None, decode: DecodeConfig | None = None, *,
                    modes: tuple[str, ...] = FUZZ_MODES, options: dict | None = None) -> st.SearchStrategy[str]:
    """Precision-mode ids from ``modes`` that ``kernel`` supports under ``decode`` (all when no kernel)."""
    keep = []
    for m in modes:
        mode = _mode(m)
        if kernel is not None and decode is not None and kernel.unsupported_reason(mode, decode, options or {}):
            continue
        keep.append(m)
    if not keep:
        raise ValueError(f"modes: kernel {getattr(kernel, 'name', kernel)!r} supports none of {list(modes)}"
                         + (f" under {decode.decode} decode" if decode is not None else ""))
    return st.sampled_from(keep)


def distributions(names: tuple[str, ...] = FUZZ_DISTRIBUTIONS) -> st.SearchStrategy[str]:
    unknown = [n for n in names if n not in DISTRIBUTIONS]
    if unknown or not names:
        raise ValueError(f"names: expected input distributions from {sorted(DISTRIBUTIONS)}, got {list(names)}")
    return st.sampled_from(names)


def batch_layouts(decode: DecodeConfig, *, max_rows: int = 3, max_extra_slots: int = 2,
                  padding: bool = True) -> st.SearchStrategy[dict]:
    """``rows``, ``num_slots``, ``slot_ids`` (-1 for padding rows, at least one active row; slots
    not named stay unused canaries) and ring ``origins`` (speculative; 0 for padding rows)."""
    if max_rows < 1:
        raise ValueError(f"max_rows: expected >= 1, got {max_rows}")
    ring = decode.ring_rows if decode.speculative else 1

    @st.composite
    def draw_layout(draw):
        rows = draw(st.integers(1, max_rows))
        pads = [False] * rows
        if padding and rows > 1:
            pads = draw(st.lists(st.booleans(), min_size=rows, max_size=rows).filter(lambda p: not all(p)))
        active = [r for r in range(rows) if not pads[r]]
        num_slots = len(active) + draw(st.integers(0, max_extra_slots))
        perm = draw(st.permutations(range(num_slots)))
        slot_of = dict(zip(active, perm))
        slot_ids = tuple(slot_of.get(r, PAD_SLOT) for r in range(rows))
        origins = tuple(0 if pads[r] else draw(st.integers(0, ring - 1)) for r in range(rows))
        return {"rows": rows, "num_slots": num_slots, "slot_ids": slot_ids, "origins": origins}

    return draw_layout()


def accepted_plans(decode: DecodeConfig, slot_ids: tuple[int, ...], *, max_steps: int = 64, min_steps: int = 1,
                   max_resets: int = 2) -> st.SearchStrategy[dict]:
    """``schedule_params`` of the ``explicit`` schedule: ``accepted[step][row]`` (k in 1..T' per
    active row, independent per row; 0 for padding rows) and ``resets`` ``[step, row, origin]``
    (slot reuse mid-run, at a new ring origin)."""
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"max_steps: expected 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    T = decode.window
    rows = len(slot_ids)
    active = [r for r, s in enumerate(slot_ids) if s != PAD_SLOT]
    ring = decode.ring_rows if decode.speculative else 1
    k_of = st.integers(1, T)

    # Short plans (what shrinking heads for) or long ones (accumulated error needs many steps).
    long_from = max(min_steps, max_steps // 2)
    n_steps = st.one_of(st.integers(min_steps, max(min_steps, min(16, max_steps))),
                        st.integers(long_from, max_steps))

    @st.composite
    def draw_plan(draw):
        n = draw(n_steps)
        acc = [[draw(k_of) if r in active else 0 for r in range(rows)] for _ in range(n)]
        params = {"accepted": acc}
        if n >= 2 and max_resets:
            resets = draw(st.lists(st.tuples(st.integers(1, n - 1), st.sampled_from(active),
                                             st.integers(0, ring - 1)),
                                   max_size=max_resets, unique_by=lambda e: (e[0], e[1])))
            if resets:
                params["resets"] = sorted([list(e) for e in resets])
        return params

    return draw_plan()


@st.composite
def scenarios(draw, family: str | None = None, kernel=None, *, geometry=None, max_steps: int = 64,
              min_steps: int = 1, max_rows: int = 3, max_window: int = 4, max_extra_buffer: int = 8,
              max_standard_buffer: int = 8, decodes: tuple[str, ...] | None = None,
              modes: tuple[str, ...] = FUZZ_MODES, dists: tuple[str, ...] = FUZZ_DISTRIBUTIONS,
              max_resets: int = 2, max_dim: int = 8, kernel_options: dict | None = None,
              sr_drift: bool = True) -> Scenario:
    """A complete Scenario (explicit schedule).  ``kernel`` (registered name or class) restricts
    the family, the decodes it is registered for and the modes it supports; ``geometry`` fixes
    the geometry (a preset name, a dict, or a strategy).

    ``sr_drift``: with a stochastic-rounding mode, half the draws go to the drift regime: the
    smallest buffer (a flush per verify), ``long-memory`` inputs (when in ``dists``) and a plan of
    ``max_steps .. 2 max_steps`` steps.  Stochastic rounding is checked against an estimate of
    its own noise (validators/engine/runner.py), so a biased or correlated rounding only shows as error
    growing faster than that noise over many flushes (docs/validation.md)."""
    cls = _kernel_class(kernel, family)
    if cls is not None:
        if family is not None and family != cls.family:
            raise ValueError(f"family: kernel {cls.name!r} is a {cls.family!r} kernel, got family {family!r}")
        family = cls.family
    if family is None:
        family = draw(families())
    if decodes is None:
        decodes = _registered_decodes(cls)
    decodes = supported_decodes(cls, decodes, modes, kernel_options)
    dec = draw(decode_configs(decodes=decodes, max_window=max_window, max_extra_buffer=max_extra_buffer,
                              max_standard_buffer=max_standard_buffer))
    pol = "spec" if cls is None else policy(getattr(cls, "bookkeeping", "spec")).name
    try:
        mode = draw(precision_modes(cls, dec.with_policy(pol), modes=modes, options=kernel_options))
    except ValueError:
        reject()  # this T' / buffer is outside what the kernel supports; other draws are not
    drift = sr_drift and _mode(mode).rounding == "stochastic" and draw(st.booleans())
    if drift:
        dec = DecodeConfig(dec.decode, dec.window, dec.window if dec.speculative else 1)
    if geometry is None:
        geo = draw(geometries(family, max_dim=max_dim))
    elif isinstance(geometry, st.SearchStrategy):
        geo = draw(geometry)
    else:
        geo = geometry
    why = None if cls is None else geometry_reason(
        cls, preset(geo, family) if isinstance(geo, str) else geometry_from_dict(geo), dec)
    if why and geometry is not None and not isinstance(geometry, st.SearchStrategy):
        raise ValueError(f"geometry: kernel {cls.name!r} does not support {geometry!r}: {why}")
    if why:
        reject()  # a shape the kernel refuses (its declared limit); the tiny preset and wider draws remain
    layout = draw(batch_layouts(dec, max_rows=max_rows))
    params = draw(accepted_plans(dec, layout["slot_ids"], max_steps=2 * max_steps if drift else max_steps,
                                 min_steps=max(min_steps, max_steps) if drift else min_steps,
                                 max_resets=max_resets))
    dist = "long-memory" if drift and "long-memory" in dists else draw(distributions(dists))
    seed = draw(st.integers(0, 2**32 - 1))
    init = draw(st.sampled_from(("random", "zeros", "prefill")))
    params = draw(serving_options(cls, dec, layout["slot_ids"], params))
    return Scenario(family=family, geometry=geo, mode=mode, decode=dec.decode, window=dec.window,
                    buffer=dec.buffer, distribution=dist, schedule="explicit",
                    schedule_params=params, steps=None, seed=seed, initial_state=init,
                    kernel_options=dict(kernel_options or {}), **layout)


def serving_options(kernel: type[KernelUnderTest] | None, decode: DecodeConfig, slot_ids: tuple[int, ...],
                    params: dict) -> st.SearchStrategy[dict]:
    """``params`` (an explicit plan) with what a serving engine does, each behind a boolean and
    only where ``kernel`` declares it (everything when ``kernel`` is None): ragged windows
    (``window_lens`` per step and row, accepted counts clamped to them; speculative, T' >= 2,
    ``supports_ragged_windows``), rows accepting nothing (some k set to 0; speculative,
    ``zero_accept = "noop"``), ``permute_rows`` (two or more rows), ``poison`` (plans with
    resets), the packed layout or strided views (``layout``, ``supports_packed_layout`` /
    ``supports_strided_views``), ``publish`` (``supports_materialize``) and standard steps on the
    speculative slots (``standard_steps``: speculative, T' >= 2, ``supports_mixed_decode`` and
    both decode kinds declared).  The bookkeeping policy (host-owned cursors included) is the
    kernel's declaration: nothing to draw."""
    active = [r for r, s in enumerate(slot_ids) if s != PAD_SLOT]
    T = decode.window
    ragged_ok = decode.speculative and T >= 2 and (kernel is None or kernel.supports_ragged_windows)
    zero_ok = decode.speculative and (kernel is None or kernel.zero_accept in ("noop", "staged"))
    packed_ok = kernel is None or kernel.supports_packed_layout
    views_ok = kernel is None or kernel.supports_strided_views
    publish_ok = kernel is None or kernel.supports_materialize
    mixed_ok = decode.speculative and T >= 2 and (kernel is None or (
        kernel.supports_mixed_decode and "standard" in kernel.decodes))

    @st.composite
    def draw_options(draw):
        out = {k: [list(row) for row in v] if k == "accepted" else v for k, v in params.items()}
        acc = out["accepted"]
        n = len(acc)
        if ragged_ok and draw(st.booleans()):
            wls = [[draw(st.integers(1, T)) if r in active else 0 for r in range(len(slot_ids))] for _ in range(n)]
            out["window_lens"] = wls
            for s in range(n):
                for r in active:
                    acc[s][r] = min(acc[s][r], wls[s][r])
        if zero_ok and draw(st.booleans()):
            for s, r in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(active)), min_size=1,
                                      max_size=max(1, n))):
                acc[s][r] = 0
        if len(slot_ids) >= 2 and draw(st.booleans()):
            out["permute_rows"] = True
        if out.get("resets"):
            how = draw(st.sampled_from(POISONS))
            if how != "none":
                out["poison"] = how
        if packed_ok and draw(st.booleans()):
            out["layout"] = "packed"
        if mixed_ok and draw(st.booleans()):
            std = sorted(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))
            out["standard_steps"] = std
            for s in std:
                for r in active:
                    acc[s][r] = 1
                    if "window_lens" in out:
                        out["window_lens"][s][r] = 1
        if views_ok and "layout" not in out and draw(st.booleans()):
            out["layout"] = "views"
        if publish_ok and draw(st.booleans()):
            out["publish"] = 0.5
        return out

    return draw_options()


def supported_decodes(kernel: type[KernelUnderTest] | None, decodes: tuple[str, ...], modes: tuple[str, ...],
                      options: dict | None = None) -> tuple[str, ...]:
    """The decode kinds of ``decodes`` under which ``kernel`` supports some mode of ``modes`` (at
    a small probe configuration, under its declared bookkeeping policy); ValueError when none."""
    if kernel is None:
        return tuple(decodes)
    pol = policy(getattr(kernel, "bookkeeping", "spec")).name
    probes = {"speculative": DecodeConfig("speculative", 2, 2, pol), "standard": DecodeConfig("standard", 1, 4, pol)}
    keep = tuple(d for d in decodes if any(
        kernel.unsupported_reason(_mode(m), probes[d], options or {}) is None for m in modes))
    if not keep:
        raise ValueError(f"kernel: {getattr(kernel, 'name', kernel)!r} supports none of the modes {list(modes)} "
                         f"under {' or '.join(decodes)} decode")
    return keep


def _registered_decodes(cls) -> tuple[str, ...]:
    """The decode kinds a kernel implements (``KernelUnderTest.decodes``; all without a kernel)."""
    return ("speculative", "standard") if cls is None else tuple(cls.decodes)


__all__ = ["FUZZ_DISTRIBUTIONS", "FUZZ_MODES", "accepted_plans", "batch_layouts", "decode_configs", "distributions",
           "families", "geometries", "precision_modes", "scenarios", "serving_options", "supported_decodes"]
