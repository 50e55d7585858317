"""A scenario resolved once, at the engine's door: the objects its names stand for, passed down.

Oracle: :func:`resolve` is the only place of the engine where a family or precision-mode name is
looked up (``family(...)``, ``parse_mode(...)``; tests/engine/test_resolved.py reads the engine's source
for any other).  ``resolve(sc, kernel, device)`` returns a frozen :class:`ResolvedScenario`: the
:class:`~replayssm.scenarios.scenario.Scenario` (which stays the JSON value), the family object,
the precision mode, the geometry, the scenario's input generator built from them
(:class:`~replayssm.scenarios.inputs.ScenarioInputs`: the inputs of every step are made without a
name lookup), the decode config under the kernel class's declared bookkeeping policy, the kernel
class and its declared conventions, the device, and the tolerance rule's constants for the mode
(``validators/engine/tolerances.py``).  The runner, the checks, the fp64 bound,
the tolerance rule and the literal-twin choice read these fields instead of resolving the
scenario's names again at every step.

Bad input raises ``ValueError`` naming the argument (``sc``, ``kernel``, ``device``,
``bookkeeping``, ``conventions``) before any work is done; nothing is changed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from replayssm.conventions import Conventions, declared
from replayssm.families import Family, family
from replayssm.interface import DecodeConfig, Geometry, KernelUnderTest, policy
from replayssm.precision import PrecisionMode, parse_mode
from replayssm.registry import get
from replayssm.scenarios.inputs import ScenarioInputs, inputs_of
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.tolerances import Tolerance, marginal_factor, output_unit, state_unit, tolerance_for


def family_of(fam: Family | str) -> Family:
    """``fam`` itself, or the family registered under that name (ValueError naming ``family``)."""
    return fam if isinstance(fam, Family) else family(fam)


def declared_policy(cls: type[KernelUnderTest]) -> str:
    """The bookkeeping policy a kernel class declares (ValueError naming ``bookkeeping`` when unknown)."""
    try:
        return policy(getattr(cls, "bookkeeping", "spec")).name
    except ValueError as e:
        raise ValueError(f"bookkeeping: kernel {getattr(cls, 'name', cls)!r} declares an unknown policy "
                         f"({str(e).split(': ', 1)[1]})") from None


def declared_conventions(cls: type[KernelUnderTest], fam: Family, decode: str, mode: PrecisionMode) -> Conventions:
    """The conventions a kernel class declares (``cls.conventions``: fields, or fields per decode
    ``{"standard": {...}, "speculative": {...}}``); ValueError naming ``conventions``."""
    decl = dict(getattr(cls, "conventions", {}) or {})
    if decl and set(decl) <= {"standard", "speculative"}:
        decl = dict(decl.get(decode, {}))
    return declared(decl, fam.conventions, mode.act_dtype, who=f"kernel {getattr(cls, 'name', '') or cls.__name__!r}")


@dataclass(frozen=True, eq=False)
class ResolvedScenario:
    """A scenario with its names resolved (see the module docstring).  ``decode``: the scenario's
    decode config under ``kernel_cls``'s declared policy; ``conventions``: the ones ``kernel_cls``
    declares (the family's defaults without a kernel); ``inputs``: the scenario's input generator
    (pass it, not ``sc``, to ``make_params`` / ``make_initial_state`` / ``make_inputs``); ``tolerance``,
    ``u_out``, ``u_state``: the rule's factor and floor and the units output and state errors are measured in;
    ``marginal_factor``: the mode's default marginal band."""

    sc: Scenario
    family: Family
    mode: PrecisionMode
    geometry: Geometry
    inputs: ScenarioInputs
    decode: DecodeConfig
    kernel_cls: type[KernelUnderTest] | None
    conventions: Conventions
    device: torch.device
    tolerance: Tolerance
    u_out: float
    u_state: float
    marginal_factor: float

    @property
    def family_name(self) -> str:
        return self.family.name

    def with_kernel(self, kernel) -> ResolvedScenario:
        """The same scenario resolved for another kernel (a literal twin): its class, policy and conventions."""
        return resolve(self, kernel, self.device)

    def with_mode(self, mode: PrecisionMode) -> ResolvedScenario:
        """The same kernel on the scenario at another mode (a stochastic-rounding replica's seed)."""
        return resolve(self.sc.replace(mode=mode.id), self.kernel_cls, self.device)


def _kernel_class(kernel, fam: Family, sc: Scenario, mode: PrecisionMode, geometry: Geometry):
    if kernel is None:
        return None
    if isinstance(kernel, KernelUnderTest):
        if kernel.geometry != geometry or kernel.mode != mode:
            raise ValueError(f"kernel: instance was built for {kernel.geometry} {kernel.mode.id}, "
                             f"the scenario needs {geometry} {sc.mode}")
        return type(kernel)
    cls = get(kernel, fam.name) if isinstance(kernel, str) else kernel
    if not (isinstance(cls, type) and issubclass(cls, KernelUnderTest)):
        raise ValueError(f"kernel: expected a registered name, a KernelUnderTest subclass or instance, got {kernel!r}")
    return cls


def _device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: expected a torch device or its name ('cpu', 'cuda:0'), got {device!r} ({e})") \
            from None


def resolve(sc: Scenario | ResolvedScenario, kernel=None, device="cpu") -> ResolvedScenario:
    """Resolve ``sc`` once for ``kernel`` (a registered name, a KernelUnderTest subclass or instance,
    or None for the scenario alone) on ``device``.  A :class:`ResolvedScenario` given as ``sc`` keeps
    its family, mode and geometry objects (only the kernel's parts are resolved again)."""
    if isinstance(sc, ResolvedScenario):
        fam, mode, geometry, base = sc.family, sc.mode, sc.geometry, sc.sc
    elif isinstance(sc, Scenario):
        fam, mode, geometry, base = family(sc.family), parse_mode(sc.mode), sc.geometry_obj, sc
    else:
        raise ValueError(f"sc: expected a Scenario, got {type(sc).__name__}")
    dev = _device(device)
    cls = _kernel_class(kernel, fam, base, mode, geometry)
    if isinstance(sc, ResolvedScenario) and cls is sc.kernel_cls:
        return sc if dev == sc.device else dataclasses.replace(sc, device=dev)
    dec = base.decode_config
    conv = declared({}, fam.conventions, mode.act_dtype)
    if cls is not None:
        dec = dec.with_policy(declared_policy(cls))
        conv = declared_conventions(cls, fam, base.decode, mode)
    if isinstance(sc, ResolvedScenario):
        return dataclasses.replace(sc, decode=dec, kernel_cls=cls, conventions=conv, device=dev)
    return ResolvedScenario(sc=base, family=fam, mode=mode, geometry=geometry,
                            inputs=inputs_of(base, fam, mode, geometry), decode=dec, kernel_cls=cls,
                            conventions=conv, device=dev, tolerance=tolerance_for(mode), u_out=output_unit(mode),
                            u_state=state_unit(mode), marginal_factor=marginal_factor(mode))


__all__ = ["ResolvedScenario", "declared_conventions", "declared_policy", "family_of", "resolve"]
