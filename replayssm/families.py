"""The family protocol: everything the suite knows about an op family, asked through one registry.

An op family (Mamba-2, Gated DeltaNet, ...) lives in one folder ``replayssm/ops/<family>/``:
``naive.py`` (the fp64 reference recurrence, plain torch), ``literal.py`` (the literal ReplaySSM
and baseline models), its kernels, and ``family.py``, which subclasses :class:`Family` and
registers one instance with :func:`register_family`.  The engine, the scenarios, the fuzzer, drift,
bench and the CLI ask this registry (:func:`family`, :func:`families`) and contain no family
``if``; an unknown family name is a ``ValueError`` naming the registered ones, never a fallback.

The built-in families are the modules named in :data:`BUILTIN_FAMILIES` (one line each); a
family defined elsewhere (a plug-in, a test) registers itself by calling :func:`register_family`.

Oracle of the numbers a family provides: its ``naive.py`` (docs/recurrences.md section 1) for the reference,
the bytes model of docs/recurrences.md sections 2-4 for the traffic model.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from replayssm.conventions import conv_kwargs
from replayssm.guard import check_name
from replayssm.interface import DecodeConfig, Geometry
from replayssm.ops.triton.row_copy import copy_rows
from replayssm.precision import PrecisionMode

# One line per built-in family: the module whose import registers it.
BUILTIN_FAMILIES = (
    "replayssm.ops.mamba2",
    "replayssm.ops.gdn",
    "replayssm.ops.kda",
)

# Input laws a family can give each of its inputs (scenarios/inputs.py turns them into values):
# "gate" normal * the distribution's dt_scale (Δ/gate pre-activations), "normal" N(0, 1),
# "value" the distribution's activation law times its value scale, "act" the activation law.
INPUT_LAWS = ("gate", "normal", "value", "act")


class Traffic(abc.ABC):
    """Bytes one decode step moves (docs/recurrences.md sections 2-4), per batch row: the bench's roofline."""

    @abc.abstractmethod
    def baseline_step(self, window: int) -> float:
        """Baseline bytes per row: state read + written (standard), (1 + T') states (speculative)."""

    @abc.abstractmethod
    def replay_step(self, decode: DecodeConfig, write_pos: int, flush: bool) -> float:
        """ReplaySSM bytes per row of one verify + commit at ``write_pos``."""

    def replay_cycle_mean(self, decode: DecodeConfig, cycle: list[tuple[int, bool]]) -> float:
        """Mean replay bytes per row over a cursor cycle of ``(write_pos, is_flush)`` steps."""
        return sum(self.replay_step(decode, wp, fl) for wp, fl in cycle) / len(cycle)


@dataclass(frozen=True)
class RecordTraffic(Traffic):
    """The docs/recurrences.md sections 2-4 bytes model of a family whose buffer holds one record per token: the fewest
    bytes a step must move per batch row, each state, record, input and output read or written once."""

    state: float  # S: one stored state (scales included)
    record: float  # one buffered token (activation-dtype records, fp32 decay records)
    inputs: float  # one token's inputs
    output: float  # one token's output

    def baseline_step(self, window: int) -> float:
        return self.state * (1 + window) + window * (self.inputs + self.output)

    def replay_step(self, decode: DecodeConfig, write_pos: int, flush: bool) -> float:
        T = decode.window
        b = self.state + write_pos * self.record + T * (self.inputs + self.output)
        if decode.speculative:
            return b + T * self.record + (self.state if flush else 0.0)
        return b + (self.state if flush else self.record)


@dataclass(frozen=True)
class FamilyMutant:
    """A broken kernel specific to one family: ``mixin`` (one deliberate bug, e.g. a class attribute
    ``math`` holding the family's literal math with one method wrong) put over the family's literal
    replay (``base="replay"``) or baseline model; the fields are ``register_mutant``'s."""

    mixin: type
    name: str  # "mutant-<name>"
    description: str
    klass: str  # one of the mutant registry's CLASSES
    base: str = "replay"
    decodes: tuple[str, ...] = ("speculative", "standard")
    gallery: bool = True  # fuzzed by the CI gallery


# The mechanisms a family's recurrence and ReplaySSM bookkeeping can have (``Family.capabilities``):
# a shared mutant declares the mechanism its bug lives in and applies to every family having it
# (validators/engine/mutants/registry.py); a check that needs a mechanism asks for it the same way.
CAPABILITIES = {
    "replay-fold": "the flush folds the checkpoint and the buffered records into a new checkpoint (every family)",
    "decay-records": "the buffer keeps decay records (role 'decay', meant to be fp32): Mamba-2 Δ, GDN/KDA g",
    "softplus-gate": "a gate or step size goes through softplus(x + dt_bias) (its threshold a declared convention)",
    "weighted-input-fold": "the fold sums weighted inputs w_j x_j B_j^T with w_j = Δ_j exp(A (c_n - c_j)) (Mamba-2)",
    "state-read-records": "records are built by reading the state through the readout dot (a delta rule's "
                          "d = beta (v - S k)): the dot's precision reaches the state through them",
    "dt-bias": "a per-head (or per-channel) bias is added to the gate pre-activation once (dt_bias)",
    "grouped-heads": "several heads read one group's inputs (Mamba-2 B, C) or one key head's (GDN, KDA q, k): "
                     "head h reads group h // (H / G)",
}


class Family(abc.ABC):
    """One op family.  Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str] = ""
    # The mechanisms it has (keys of CAPABILITIES): shared mutants apply to every family having theirs.
    capabilities: ClassVar[frozenset[str]] = frozenset()
    description: ClassVar[str] = ""
    geometry_cls: ClassVar[type]
    presets: ClassVar[Mapping[str, Any]] = {}
    bench_geometry: ClassVar[str] = ""  # the preset the bench and GPU tests use by default

    # ---- geometry -----------------------------------------------------------------------------------
    def geometry_from_dict(self, d: dict):
        fields = set(self.geometry_cls.__dataclass_fields__)
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"geometry: unknown field(s) {sorted(unknown)}; expected {sorted(fields)}")
        try:
            return self.geometry_cls(**d)
        except TypeError as e:
            raise ValueError(f"geometry: {e}") from None

    @abc.abstractmethod
    def strategy_geometry(self, st, dims: list[int], wide: list[int]):
        """A Hypothesis strategy of small custom geometry dicts (``st`` is ``hypothesis.strategies``,
        passed in so the core does not import Hypothesis): ``dims`` the allowed sizes, ``wide`` those
        >= 2; 1-2 groups / key heads with 1-2 heads each, so a wrong head-to-group map shows."""

    # ---- laws of parameters and inputs ---------------------------------------------------------------
    @abc.abstractmethod
    def make_params(self, uniform: Callable[[str], torch.Tensor], dist) -> dict[str, torch.Tensor]:
        """The layer parameters from ``uniform(name)`` (U[0, 1) of the parameter's shape, drawn from the
        parameter's own stream) and the scenario's input distribution ``dist`` (its ``neg_A`` range
        and ``dt_bias`` (offset, width): ``scenarios.inputs.Distribution``)."""

    @abc.abstractmethod
    def input_law(self, name: str) -> str:
        """The law (one of :data:`INPUT_LAWS`) input ``name`` is drawn from."""

    # ---- the fp64 reference (docs/recurrences.md section 1) -------------------------------------------
    # The declared conventions (replayssm/conventions.py) the family's recurrence has: a family
    # listing some takes ``conv=`` in reference_prepare / reference_advance and in its literal
    # math's window / step (it is only passed when a kernel declares one other than the default).
    conventions: tuple[str, ...] = ()

    @abc.abstractmethod
    def reference_prepare(self, tok: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> dict:
        """The exact, elementwise part of one reference step (casts, per-head broadcasts, bias adds):
        any leading dims, so a whole chunk of tokens can be prepared at once with the same bits."""

    @abc.abstractmethod
    def reference_advance(self, state: torch.Tensor, prep: dict, params: dict[str, torch.Tensor]
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rest of the step on one token's prepared inputs: ``(output, new state)``."""

    def reference_advance_fused(self, state: torch.Tensor, prep: dict, params: dict[str, torch.Tensor],
                                rows: torch.Tensor | None = None,
                                keep: tuple[torch.Tensor, torch.Tensor] | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`reference_advance`, bit for bit, with its full-state passes fused where the family
        has such a form (a Triton kernel: a CUDA state, or any state under the Triton interpreter);
        the drift fast path's reference on a GPU.  ``rows``: a bool mask over the state's leading (batch)
        rows; a fused pass may compute only those, the others' results then undefined (drift's shadow
        state, read only where a row is armed).  ``keep``: ``(dst, mask)``, a contiguous fp64 state and a bool
        mask over its rows: the new state's marked rows also written into ``dst`` in place, exactly (drift's
        kept rows; ``dst`` may be ``state``).  Default: :meth:`reference_advance` itself, every row, the kept rows
        copied after it."""
        y, new = self.reference_advance(state, prep, params)
        if keep is not None:
            copy_rows(keep[0], new, keep[1])
        return y, new

    def reference_advance_magnitude(self, state: torch.Tensor, prep: dict, params: dict[str, torch.Tensor],
                                    keep: tuple[torch.Tensor, torch.Tensor] | None = None
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """:meth:`reference_advance_fused` and :meth:`readout_magnitude` of ``|S'|`` (unscaled states),
        bit for bit, the magnitude read from the readout products ``S' ∘ c`` the fused pass writes
        (``|s c| = |s| |c|`` in IEEE arithmetic: one state-sized pass fewer per token than ``|S'|`` and
        its product with ``|c|``): ``(output, new state, magnitude)``; None where the family has no such
        pass (then drift's fast path takes :meth:`readout_magnitude` of ``|S'|`` itself).  ``keep``: as
        :meth:`reference_advance_fused`'s."""
        return None

    def reference_hoist(self, prep: dict, params: dict[str, torch.Tensor]) -> dict:
        """``prep`` (of any leading dims) with the state-independent, elementwise rest of the step
        added (transcendentals included), which :meth:`reference_advance_fused` then takes as given:
        for a whole chunk of tokens at once on a CUDA device, where an elementwise function's value
        does not depend on the tensor's shape (on a CPU it does: the vector and scalar loops round
        ``log1p`` differently).  Default: ``prep`` unchanged."""
        return prep

    def reference_step(self, state: torch.Tensor, tok: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
                       conv=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One reference step (docs/recurrences.md section 1) for all rows, in the dtype of ``state``:
        ``(output, new state)``;
        ``conv``: the kernel's declared conventions (None or the defaults: the family's own)."""
        kw = conv_kwargs(conv)
        return self.reference_advance(state, self.reference_prepare(tok, params, **kw), params, **kw)

    @abc.abstractmethod
    def readout_magnitude(self, state_abs: torch.Tensor, tok: dict[str, torch.Tensor],
                          params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per output element, the magnitude of the terms it sums (e.g. Mamba-2 ``sum_n |S_pn||C_n| + |D x|``)
        given ``|S|`` (already replaced by row maxima for per-row scaled states): the scale the
        tolerance floor is relative to, however small the output is after cancellation."""

    # ---- literal models and mutants ------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def literal_replay(self) -> type:
        """The literal ReplaySSM model class (``literal-replay``): the base of the engine's mutants."""

    @property
    @abc.abstractmethod
    def literal_baseline(self) -> type:
        """The literal baseline class (``literal-baseline``)."""

    # Correct literal models with the default bookkeeping that read the state through the readout dot
    # in another order or precision than ``literal_replay`` (the recurrent in-window solve: S_t k at every
    # token instead of S_0 k once; the dots in ieee fp32, more precise than the declared one, which moves
    # the records' rounding to the activation format elsewhere): at a -tf32 / -tf32x3 mode the tolerance
    # rule takes the larger of their errors and the literal twin's, since a correct kernel may read the
    # state either way (a GDN ieee-dot variant failed `state` at 1.16x the twin-only rule: the nightly
    # fuzz's reproducer in golden/regressions).
    dot_order_literals: ClassVar[tuple[str, ...]] = ()

    # Broken kernels only this family has (its own arithmetic's slips): the mutant registry
    # (validators/engine/mutants/) registers each on this family's literal model, beside the shared ones.
    mutants: ClassVar[tuple[FamilyMutant, ...]] = ()

    # ---- bench --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def traffic(self, geometry, mode: PrecisionMode) -> Traffic:
        """The bytes model of ``geometry`` at ``mode``."""

    def bench_launch_candidates(self, kind: str, decode: DecodeConfig, batch: int) -> list[dict]:
        """Launch options of the family's Triton ``kind`` ("replay" or "baseline") kernel that the bench
        sweeps at ``batch`` (the first is the default)."""
        return [{}]


_FAMILIES: dict[str, Family] = {}
_LOADED = False


def register_family(fam: Family, *, replace: bool = False) -> Family:
    """Register ``fam`` (an instance of a :class:`Family` subclass) under ``fam.name``."""
    if not isinstance(fam, Family):
        raise ValueError(f"fam: expected a Family instance, got {fam!r}")
    if not fam.name:
        raise ValueError(f"fam: {type(fam).__name__} must set the class attribute name")
    check_name(fam.name, "name")  # family names become parts of file names
    unknown = set(fam.capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"fam.capabilities: unknown mechanism(s) {sorted(unknown)}; "
                         f"expected some of {sorted(CAPABILITIES)}")
    have = _FAMILIES.get(fam.name)
    if have is not None and type(have) is not type(fam) and not replace:
        raise ValueError(f"name: family {fam.name!r} is already registered ({type(have).__name__})")
    _FAMILIES[fam.name] = fam
    return fam


def unregister_family(name: str) -> None:
    """Remove a family registered by a plug-in or a test (not a built-in)."""
    _load_builtins()
    if any(f"replayssm.ops.{name}" == m for m in BUILTIN_FAMILIES):
        raise ValueError(f"name: {name!r} is a built-in family")
    _FAMILIES.pop(name, None)


def _load_builtins() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for mod in BUILTIN_FAMILIES:
            importlib.import_module(mod)


def families() -> dict[str, Family]:
    """Every registered family by name (built-ins first, in registration order)."""
    _load_builtins()
    return dict(_FAMILIES)


def family_names() -> tuple[str, ...]:
    return tuple(families())


def family(name: str) -> Family:
    """The family registered as ``name``; ValueError lists the registered ones."""
    _load_builtins()
    fam = _FAMILIES.get(name)
    if fam is None:
        raise ValueError(f"family: expected one of {sorted(_FAMILIES)}, got {name!r}")
    return fam


def preset(name: str, family_name: str):
    """The preset geometry ``name`` of family ``family_name``; ValueError lists what exists."""
    fam = family(family_name)
    if name not in fam.presets:
        raise ValueError(f"geometry: no preset {name!r} for family {family_name!r}; expected one of "
                         f"{sorted(fam.presets)}")
    return fam.presets[name]


def preset_names() -> list[str]:
    """Every preset name of every family."""
    return sorted({p for f in families().values() for p in f.presets})


def geometry_from_dict(d: dict):
    """Rebuild a geometry from its ``to_dict()``; unknown or missing fields raise ValueError."""
    if not isinstance(d, dict):
        raise ValueError(f"geometry: expected an object, got {type(d).__name__}")
    name = d.get("family")
    if name not in families():
        raise ValueError(f"geometry.family: expected one of {family_names()}, got {name!r}")
    return family(name).geometry_from_dict(d)


def uniform_in(u01: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Map U[0, 1) draws to U[lo, hi) (the parameter laws' one affine map)."""
    return torch.add(torch.mul(u01, hi - lo), lo)


def check_positive_dims(geometry, names: tuple[str, ...]) -> None:
    """Shared geometry check: each named field is a positive integer."""
    for f in names:
        v = getattr(geometry, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{f}: expected a positive integer, got {v!r}")


__all__ = ["BUILTIN_FAMILIES", "CAPABILITIES", "INPUT_LAWS", "Family", "FamilyMutant", "Geometry", "RecordTraffic",
           "Traffic",
           "check_positive_dims", "families", "family", "family_names", "geometry_from_dict", "preset", "preset_names",
           "register_family", "uniform_in", "unregister_family"]
