"""Drive a kernel through a scenario, step by step, beside the fp64 reference and the literal model.

Oracle (docs/validation.md): the fp64, non-speculative, token-by-token recurrence of docs/recurrences.md
section 1 on the accepted token stream, fed the same inputs (sampled in the activation dtype, upcast exactly).  Window
position s of every verify is compared with the reference run on committed prefix +
window[0..s], drafts included; after each commit the kernel's committed state is compared with
the reference state after the accepted prefix; at every flush its checkpoint is compared with
the reference state at the folded token count.  Tolerances come from
``validators/engine/tolerances.py`` (err <= factor x literal-model error at the same mode + floor); the
exact invariants from ``validators/engine/invariants.py``.  Every check is a registered unit of
``validators/engine/checks/``; this module only orchestrates: plan -> reset rows -> verify -> the checks
of each hook (verify-returned, after-verify, at-flush) -> commit -> the after-commit checks, and
the end-of-run checks after the last step.

:class:`Lockstep` is the step-level engine (the drift helper builds on it; ``state_dict`` /
``load_state_dict`` checkpoint and resume it); :func:`run_scenario` runs a whole scenario,
repeats it for the bit-identity check and returns a :class:`ValidationResult`.

Serving-engine steps (issue 14): what the kernel declares decides how a step is driven.  Rows
that accept nothing (k = 0 in the plan) are committed as k = 0 to a ``zero_accept = "noop"``
kernel (the ``zero-accept`` check: nothing changed) and, for a refusing kernel, probed (commit
must raise ``ValueError`` naming ``accepted[r]`` and change nothing), then committed as k = 1.
Ragged windows (``window_lens`` in the plan) need ``supports_ragged_windows``: positions past
T'_r must keep the poison (the ``window-tail`` check); the value checks then see those positions
filled with the fp64 reference rounded to the activation dtype (for kernel and literal alike: a
position that does not exist is neither right nor wrong).  Every cursor rule is the kernel's
declared ``bookkeeping`` policy.  A plan's ``perm`` reorders the batch rows of the kernel's calls
(the engine un-permutes its outputs); ``poison`` fills a recycled slot's previous storage with NaN
or 2^100 (through ``snapshot``/``restore``) before it is reset.  A ``packed`` plan (needs
``supports_packed_layout``) hands the kernel the step's tokens back to back with
``query_start_loc``, in a buffer of R x T' tokens whose spare tail holds the padded layout's
unused positions (so a write there shows as a write past a row's window or into a padding row);
a ``standard`` step (needs ``supports_mixed_decode``) gives the speculative kernel object, and
its literal model, one-token inputs (a request with drafting switched off).  Under
``host-cursors`` the engine owns the cursor table: it passes it to ``verify`` and
``committed_state`` and reports it in the kernel's snapshots.

The reference is batched over rows on the kernel's device in fp64 (no per-element Python loops).
The literal model (per-row Python) is only needed for the tolerance rule: ``literal_every``
samples it (0: never); on the steps it does not run, the fp64 running-error bound of
``validators/engine/checks/fp64_bound.py`` judges outputs, states and checkpoints instead (a family
without an error model keeps the literal model on every step): no option turns the numerical
checks off.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
import traceback
from collections import Counter

import numpy as np
import torch

from replayssm.conventions import Conventions
from replayssm.families import Family, families
from replayssm.interface import PAD_SLOT, KernelConfig, KernelUnderTest, policy
from replayssm.ops.literal import (
    LiteralFlushWhenFullKernel,
    LiteralFoldAtCommitKernel,
    LiteralFoldEveryCommitKernel,
    LiteralHostCursorsKernel,
)
from replayssm.ops.literal_next_verify import LiteralNextVerifyFoldKernel
from replayssm.ops.literal_staged import LiteralStagedFoldKernel
from replayssm.registry import get, register
from replayssm.scenarios.inputs import make_initial_state, make_inputs, make_params
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import POISON_LARGE, StepPlan, plan
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine import mutants  # noqa: F401 - registers every mutant by name
from replayssm.validators.engine.checks import CHECKS, HOOKS, RunContext, StepContext, ToleranceRule, checks_at
from replayssm.validators.engine.checks.fp64_bound import RunningBound, error_model, state_norm
from replayssm.validators.engine.checks.tolerance_rule import SR_WALK_CAP
from replayssm.validators.engine.cursor_table import CursorTable, commit_cursor
from replayssm.validators.engine.engine_views import Gaps, column_view, strided_views
from replayssm.validators.engine.golden_truth import GoldenTruth, masked
from replayssm.validators.engine.metrics import error_metrics
from replayssm.validators.engine.orchestrator import Orchestrator, StepState
from replayssm.validators.engine.poison_alloc import HOW as POISON_HOW
from replayssm.validators.engine.poison_alloc import poison_kernel_calls
from replayssm.validators.engine.resolved import ResolvedScenario, declared_policy, family_of, resolve
from replayssm.validators.engine.result import Failure, ValidationResult

CANARY_GENERATION = 1 << 40
# The per-step metrics (``Lockstep.metrics``, the result's ``worst <metric>`` summary).
METRICS = ("max_abs", "rel_l2", "rms_ratio", "in_u", "literal_max_abs", "bound_ratio", "state_err",
           "state_bound_ratio", "checkpoint_bound_ratio", "flush_increment_ratio")
# The ratio of error to bound each banded check records per step (the run's margin).
BANDED_METRICS = {"bound_ratio": "output", "state_bound_ratio": "state", "checkpoint_bound_ratio": "flush-checkpoint"}
# With stochastic rounding the literal model's error is a random draw: the bound uses the running
# maximum over the literal and this many replicas with other rounding seeds (fp8 SR with long
# memory: independent streams drift several ulps apart, docs/fuzzing.md).
SR_REPLICAS = 2


def reference_step(fam: Family | str, state: torch.Tensor, tok: dict[str, torch.Tensor],
                   params: dict[str, torch.Tensor], conv: Conventions | None = None):
    """One fp64 recurrence step (docs/recurrences.md section 1) of the family's ``naive.py`` for all rows:
    (output, new state); ``fam``: the family (or its name);
    ``conv``: the kernel's declared conventions (replayssm/conventions.py)."""
    return family_of(fam).reference_step(state, tok, params, conv)


def kernel_conventions(cls: type[KernelUnderTest], sc: Scenario | ResolvedScenario) -> Conventions:
    """The conventions a kernel class declares for ``sc`` (``cls.conventions``: fields, or fields per
    decode ``{"standard": {...}, "speculative": {...}}``); ValueError naming ``conventions``."""
    return resolve(sc, cls).conventions


def readout_magnitude(fam: Family | str, state: torch.Tensor, tok: dict[str, torch.Tensor],
                      params: dict[str, torch.Tensor], scaled: bool) -> torch.Tensor:
    """The magnitude of the terms each output sums (the condition of the readout), per output
    element (the family's ``readout_magnitude``, e.g. Mamba-2 ``sum_n |S_pn| |C_n| + |D x|``); for
    per-row scaled states (fp8/int8, error relative to the row's max) ``|S|`` is the row's max.
    Rounding the state by u moves an output by up to u times this, however small the output is
    after cancellation: the tolerance floor is relative to it (found by the fuzzer, issue 6)."""
    S = state.abs()
    if scaled:
        S = S.amax(-1, keepdim=True).expand_as(S)
    return family_of(fam).readout_magnitude(S, tok, params)


# The literal replay model of each non-default bookkeeping policy (a mixin over the family's).
POLICY_LITERALS = {"flush-when-full": LiteralFlushWhenFullKernel, "fold-every-commit": LiteralFoldEveryCommitKernel,
                   "host-cursors": LiteralHostCursorsKernel, "fold-at-commit": LiteralFoldAtCommitKernel}


def _literal_mixin(fam: Family, name: str, mixin: type) -> str:
    """Register ``name`` for the family (on first use): ``mixin`` over the family's literal replay model."""
    try:
        get(name, fam.name)
    except ValueError:
        register(type(f"{mixin.__name__}_{fam.name}", (mixin, fam.literal_replay),
                      {"name": name, "family": fam.name, "__module__": mixin.__module__}), replace=True)
    return name


def policy_literal_name(fam: Family | str, policy_name: str) -> str:
    """The registered literal replay model of ``policy_name`` for the family (``literal-replay``
    for the spec's rule, else ``literal-replay-<policy>``, registered on first use)."""
    pol = policy(policy_name).name
    if pol == "spec":
        return "literal-replay"
    return _literal_mixin(family_of(fam), f"literal-replay-{pol}", POLICY_LITERALS[pol])


def staged_literal_name(fam: Family | str) -> str:
    """The registered literal model of a staged fold (``zero_accept = "staged"``,
    replayssm/ops/literal_staged.py) for the family: ``literal-replay-staged``."""
    return _literal_mixin(family_of(fam), "literal-replay-staged", LiteralStagedFoldKernel)


def next_verify_literal_name(fam: Family | str) -> str:
    """The registered literal model of a fold at the next verify (``fold_at = "next-verify"``,
    replayssm/ops/literal_next_verify.py) for the family: ``literal-replay-fold-at-next-verify``."""
    return _literal_mixin(family_of(fam), "literal-replay-fold-at-next-verify", LiteralNextVerifyFoldKernel)


# registered in this order: policies, staged, next-verify (each for every family)
for _fam in families().values():
    for _pol in POLICY_LITERALS:
        policy_literal_name(_fam, _pol)
for _fam in families().values():
    staged_literal_name(_fam)
for _fam in families().values():
    next_verify_literal_name(_fam)


def literal_twin_name(cls: type[KernelUnderTest], sc: Scenario | ResolvedScenario) -> str | None:
    """The literal model a kernel is compared with: ``cls.literal_twin`` if set, else the literal
    baseline for baseline kernels and the literal replay model of the kernel's declared policy
    otherwise; None when it cannot run the scenario's mode."""
    r = sc if isinstance(sc, ResolvedScenario) else resolve(sc)
    pol = declared_policy(cls)
    default = "literal-baseline" if cls.kind == "baseline" else policy_literal_name(r.family, pol)
    name = getattr(cls, "literal_twin", None) or default
    for cand in (name, default):
        try:
            lit = get(cand, r.family.name)
        except ValueError:
            continue
        if lit.unsupported_reason(r.mode, r.sc.decode_config, dict(r.sc.kernel_options)) is None:
            return cand
    return None


def build_kernel(kernel, sc: Scenario | ResolvedScenario, device, params=None, twin: bool = False,
                 conventions: Conventions | None = None) -> KernelUnderTest:
    """A kernel for ``sc``: a registered name, a KernelUnderTest subclass, or an instance.  A literal
    ``twin`` gets only the scenario's kernel options it declares (the rest are the kernel under test's)
    and computes with ``conventions`` (the kernel under test's; otherwise a kernel gets its own)."""
    if isinstance(kernel, KernelUnderTest):
        return kernel
    r = resolve(sc, kernel, device)
    cls = r.kernel_cls
    if params is None:
        params = make_params(r.inputs)
    cfg = KernelConfig(r.geometry, {k: v.to(r.device) for k, v in params.items()}, r.mode, r.decode,
                       num_slots=r.sc.num_slots, device=r.device,
                       options={k: v for k, v in r.sc.kernel_options.items() if not twin or k in cls.accepted_options},
                       conventions=conventions if conventions is not None else r.conventions)
    return cls(cfg)


class Lockstep(Orchestrator):
    """Step-level engine: the kernel under test, the literal model and the fp64 reference in lockstep.

    ``kernel``: registered name, KernelUnderTest subclass, or an instance built for ``sc``
    (a fresh instance each run).  ``literal_every``: run the literal model (tolerance rule) every
    n-th step (0: never; the fp64 running-error bound judges the other steps).
    ``invariants_every``: snapshot-based exact checks every n-th step and the last step.
    ``state_every``: committed-state check every n-th step and the last step.  The checkpoint of
    every flush is judged (``flush-checkpoint``) unless both are 0, which only jobs that judge
    states themselves use (drift, the golden trajectories, the repeat run); :func:`run_scenario`
    refuses 0 for either.  ``max_failures``: failures kept in full (all are counted).
    ``truth``: ``"reference"`` (the fp64 reference, recomputed) or ``"golden"`` (read from the
    golden fp64 trajectories of a canonical scenario, ``validators/engine/golden_truth.py``: the value
    checks judge the stored elements at the stored steps; ValueError naming ``truth`` when the
    scenario is no golden entry's or the data fails its sha256 manifest).

    The checks are the registered units of ``validators/engine/checks/`` (``CHECKS``): each runs at its
    hooks on the steps its schedule names, for the kernel kinds it lists; a snapshot is taken only
    when a check due at that step needs it.
    """

    def __init__(self, sc: Scenario | ResolvedScenario, kernel, *, device="cpu", literal_every: int = 1,
                 invariants_every: int = 1, state_every: int = 1, max_failures: int = 200, record_metrics: bool = True,
                 digest: bool = True, steps: list[StepPlan] | None = None, truth: str = "reference",
                 poison_allocations: str | None = None, marginal_factor: float | None = None) -> None:
        if truth not in ("reference", "golden"):
            raise ValueError(f"truth: expected 'reference' or 'golden', got {truth!r}")
        if poison_allocations not in (None, *POISON_HOW):
            raise ValueError(f"poison_allocations (--poison-allocations): expected one of {list(POISON_HOW)}, got "
                             f"{poison_allocations!r}")
        self.poison_allocations = poison_allocations
        # The scenario's names resolved once (validators/engine/resolved.py): checks and helpers read ``resolved``.
        self.resolved = r = resolve(sc, kernel, device)
        sc = r.sc
        self.marginal_factor = r.marginal_factor if marginal_factor is None else float(marginal_factor)
        if not self.marginal_factor >= 1.0:
            raise ValueError(f"marginal_factor: expected a number >= 1 (1: no marginal band), got {marginal_factor!r}")
        self.golden = GoldenTruth.load(sc) if truth == "golden" else None
        for name, v in (("literal_every", literal_every), ("invariants_every", invariants_every),
                        ("state_every", state_every)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {v!r}")
        self.sc = sc
        self.device = r.device
        self.params = make_params(r.inputs)
        self.kernel = build_kernel(kernel, r, self.device, self.params)
        self.kernel_name = self.kernel.name or type(self.kernel).__name__
        # The recurrence the kernel claims (its declared conventions): the reference and the literal
        # model follow it.
        self.conv = r.conventions
        if self.golden is not None and not self.conv.is_default:
            raise ValueError(f"truth: golden: the golden trajectories follow the default conventions; kernel "
                             f"{self.kernel_name!r} declares {self.conv.changes()}")
        # The fp64 running-error bound judges every step the literal model does not run; a family
        # without an error model keeps the literal model on every step (no option turns the
        # numerical checks off).
        terms = error_model(r.family, self.conv)
        self.replay_kind = getattr(self.kernel, "base_kind", self.kernel.kind) != "baseline"
        init0 = make_initial_state(r.inputs, 0, self.device)
        heads = state_norm(init0).shape[1]
        self.bound = (RunningBound(terms, r.mode, self.replay_kind, sc.rows, heads, self.device,
                                   records_read_state="state-read-records" in r.family.capabilities)
                      if terms is not None else None)
        if self.bound is None and not literal_every:
            literal_every = 1
        self.literal_name = literal_twin_name(r.kernel_cls, r) if literal_every else None
        self.literal = (build_kernel(self.literal_name, r, self.device, self.params, twin=True, conventions=self.conv)
                        if self.literal_name else None)
        self.literal_every = literal_every if self.literal is not None else 0
        self.replicas = []
        if self.literal is not None and r.mode.rounding == "stochastic":
            for i in range(1, SR_REPLICAS + 1):
                rr = r.with_mode(dataclasses.replace(r.mode, seed=r.mode.seed + 7919 * i))
                self.replicas.append(build_kernel(self.literal_name, rr, self.device, self.params, twin=True,
                                                  conventions=self.conv))
        if self.literal_name == "literal-replay" and r.mode.dot != "ieee":
            # a readout dot's rounding reaches the state through the records the family reads the state for:
            # the literal models reading it in another order join the rule (Family.dot_order_literals)
            for name in r.family.dot_order_literals:
                self.replicas.append(build_kernel(name, r, self.device, self.params, twin=True,
                                                  conventions=self.conv))
        self.invariants_every = invariants_every
        self.state_every = state_every
        self.max_failures = max_failures
        self.record_metrics = record_metrics
        self.plans = steps if steps is not None else plan(sc)
        self.ids_list = list(sc.resolved_slot_ids)
        self.ids = torch.tensor(self.ids_list, dtype=torch.int64, device=self.device)
        self.active = [r for r, s in enumerate(self.ids_list) if s != PAD_SLOT]
        self.pad_rows = [r for r, s in enumerate(self.ids_list) if s == PAD_SLOT]
        self.active_idx = torch.tensor(self.active, dtype=torch.long, device=self.device)
        self.pad_idx = torch.tensor(self.pad_rows, dtype=torch.long, device=self.device)
        self.last_step: dict = {}
        self.notes: list[str] = []
        self.ref_params = {k: v.to(self.device, torch.float64) for k, v in self.params.items()}
        # The declared policy of the kernel's class (an instance may have swapped its own rule).
        self.dec = r.decode
        self.ragged = any(p.window_lens is not None for p in self.plans)
        self.zero_noop = self.kernel.zero_accept in ("noop", "staged") and self.dec.speculative
        # A staged fold (zero_accept "staged"): a flush's checkpoint is judged after the commit, on the
        # rows that accepted k >= 1; commit(0) moves no cursor.
        self.staged = self.kernel.zero_accept == "staged" and self.dec.speculative
        self._cursors: CursorTable | None = None  # the cursor rule tabulated (cursors_before)
        # A fold at the next verify (fold_at "next-verify"): a flush's fold lands at the slot's next
        # verify; only that verify may rewrite the checkpoint, and the flush's checks (its context kept
        # until then: ``deferred``) judge the checkpoint after it.  ``owed``: rows whose next verify folds.
        self.next_verify = getattr(self.kernel, "fold_at", "flush") == "next-verify" and self.dec.speculative
        self.owed: set[int] = set()
        self.deferred: tuple | None = None
        if self.ragged and self.golden is not None:
            raise ValueError("truth: golden: the plan has ragged windows; the golden scenarios have none")
        if self.ragged:
            for who, obj in (("kernel", self.kernel), ("literal model", self.literal)):
                if obj is not None and not getattr(obj, "supports_ragged_windows", False):
                    raise ValueError(f"scenario.schedule: the plan has ragged windows (window_lens) and the {who} "
                                     f"{obj.name or type(obj).__name__!r} does not support them "
                                     f"(supports_ragged_windows is False)")
        for what, attr, used in (("the packed layout (query_start_loc)", "supports_packed_layout",
                                  any(p.layout == "packed" for p in self.plans)),
                                 ("strided views of wider buffers (layout 'views')", "supports_strided_views",
                                  any(p.layout == "views" for p in self.plans)),
                                 ("publishing with materialize (publish)", "supports_materialize",
                                  bool(sc.schedule_params.get("publish"))),
                                 ("standard steps on a speculative slot", "supports_mixed_decode",
                                  any(p.standard for p in self.plans))):
            if used and not getattr(self.kernel, attr, False):
                raise ValueError(f"scenario.schedule: the plan has {what} and the kernel {self.kernel_name!r} does "
                                 f"not support it ({attr} is False)")
        if any(p.standard for p in self.plans) and not (self.dec.speculative and "standard" in self.kernel.decodes):
            raise ValueError(f"scenario.schedule: standard steps on a speculative slot need speculative decode and a "
                             f"kernel declaring both decode kinds; {self.kernel_name!r} declares {self.kernel.decodes}")
        self.host_cursors = self.dec.host_owned
        self.cursor_table = [[0, 0] for _ in range(sc.num_slots)]  # the caller's cursors (host-cursors policy)
        self._pack_idx: torch.Tensor | None = None
        # The tensors handed to the kernel's last verify / commit, with their bits before the call
        # when the inputs-unchanged check is due (``watch_inputs``): call -> name -> (given, copy).
        self.watch_inputs = False
        self.view_gaps: dict[str, list[Gaps]] = {}  # layout "views": the wider buffers' gaps, per call
        # ``publish`` (the materialize check): per row, the fp64 reference state after each token of
        # the committed history, the checkpoint's first (at most max write_pos + 1 kept)
        self.publish = float(sc.schedule_params.get("publish", 0.0)) if self.golden is None else 0.0
        self.ref_hist: list[list[torch.Tensor]] = []
        self.published: set[int] = set()  # slots materialize published into (the repeat run skips them)
        self.ref_tokens: torch.Tensor | None = None
        self.given: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        if any(p.poison != "none" and p.reset_rows for p in self.plans) and not self.kernel.supports_restore:
            self.notes.append("the kernel cannot restore a snapshot: recycled slots were not poisoned before reuse")
        # A mutant built on a baseline says so in ``base_kind`` (its kind is "mutant").
        self.kind = "replay" if self.replay_kind else "baseline"
        self.hooks = {h: checks_at(h, self.kind) for h in HOOKS}
        self.rule = ToleranceRule(r, sc.rows, self.device, label=sc.mode)
        self.step_idx = 0
        self.started = False
        self.digest = inv.RunDigest() if digest else None
        self.failures: list[Failure] = []
        self.failure_counts: Counter = Counter()
        # Errors of banded checks above the bound by at most ``marginal_factor`` (not failures).
        self.marginals: list[Failure] = []
        self.marginal_counts: Counter = Counter()
        self.metrics: dict[str, list] = {k: [] for k in ("step", *METRICS)}
        self.coverage: Counter = Counter()
        self.phases: set = set()
        self.tokens_accepted = 0
        self.tokens_verified = 0
        self.canary: dict[int, dict[str, torch.Tensor]] = {}
        self.ran_at_end: list[str] = []
        # Stochastic rounding: the literal model's error is one random draw of the mode's noise; the
        # bound uses the running maximum (literal and replicas) per row since the row's last reset.
        self.lit_env = self.rule.envelope
        if poison_allocations:  # (validators/engine/poison_alloc.py) every empty-like buffer of the kernel's calls
            poison_kernel_calls(self.kernel, poison_allocations, self.coverage)

    @property
    def literals(self) -> list[KernelUnderTest]:
        """The literal model and its stochastic-rounding replicas (empty without a literal)."""
        return [] if self.literal is None else [self.literal, *self.replicas]

    # ---- setup --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Fill unused slots with canary data, reset the scenario's rows, snapshot the canaries."""
        sc, k = self.sc, self.kernel
        unused = sc.unused_slots
        if unused:
            csc = self.resolved.inputs.replace(rows=len(unused), slot_ids=tuple(unused), origins=None,
                                               schedule="always-1", schedule_params={}, steps=None,
                                               initial_state="random")
            cids = torch.tensor(unused, dtype=torch.int64, device=self.device)
            cinit = make_initial_state(csc, generation=CANARY_GENERATION, device=self.device)
            corig = None
            if self.dec.uses_ring:
                corig = torch.tensor([(3 + 5 * i) % self.dec.ring_rows for i in range(len(unused))], dtype=torch.int64,
                                     device=self.device)
            k.reset(cids, cinit, corig)
            kc = min(2, sc.window)
            for i, s in enumerate(unused):
                self.cursor_table[s] = [0, 0 if corig is None else int(corig[i])]
            k.verify(cids, make_inputs(csc, 0, self.device, stream="canary"), **self.cursor_kw(k))
            k.commit(cids, torch.full((len(unused),), kc, dtype=torch.int64, device=self.device))
            for s in unused:
                w, o = self.cursor_table[s]
                self.cursor_table[s] = list(self.dec.commit_cursor(w, o, self.dec.is_flush(w), kc))
        init = make_initial_state(self.resolved.inputs, 0, self.device)
        origins = torch.tensor(self._origins(sc.resolved_origins), dtype=torch.int64, device=self.device)
        for r, s in enumerate(self.ids_list):
            if s != PAD_SLOT:
                self.cursor_table[s] = [0, int(origins[r])]
        k.reset(self.ids, *self._reset_args(sc.initial_state == "zeros", init, origins))
        if sc.initial_state == "zeros":
            self.coverage["resets through the defaults (initial_state=None)"] += len(self.active)
        for lit in self.literals:
            lit.reset(self.ids, init, origins)
        if self.bound is not None and self.active:
            self.bound.reset(self.active, init)
        self.ref = init.clone()
        self.ref_hist = [[init[r]] for r in range(sc.rows)]
        self.owed, self.deferred = set(), None
        self.wp = [0] * sc.rows
        self.origin = self._origins(sc.resolved_origins)
        if unused and any("canaries" in c.needs and self._enabled(c.schedule)
                          for checks in self.hooks.values() for c in checks):
            snap = self.snapshot()
            self.canary = {s: {n: t.clone() for n, t in inv.slot_view(snap, s).items()} for s in unused}
        self.started = True

    @staticmethod
    def _reset_args(default: bool, init: torch.Tensor, origins: torch.Tensor) -> tuple:
        """The kernel's ``reset`` arguments after the slot ids: with ``default`` the documented
        defaults of docs/kernel_interface.md (``initial_state=None``: zeros, which ``init`` must
        hold; ``origin=None``: 0, where every origin is 0), else ``init`` and ``origins``."""
        if not default:
            return init, origins
        return None, (None if not bool(origins.any()) else origins)

    def cursors_before(self, step: int) -> list[tuple[int, int]]:
        """Every row's ``(write_pos, origin)`` before the verify of plan step ``step`` (after that
        step's resets), walked from the plan by the cursor rule :meth:`step` moves them by (the
        policy's, a staged fold's commit(0) moving none: ``cursor_table.commit_cursor``), all rows
        at once through its tables; the same on drift's fast path, which keeps no per-step cursors.
        Walks forward from the last step asked (failure messages ask in step order)."""
        if self._cursors is None:
            self._cursors = CursorTable(self.dec, self.staged)
        rows = np.zeros(self.sc.rows, dtype=bool)
        rows[self.active] = True
        walk = getattr(self, "_cursor_walk", None)
        if walk is None or walk[0] >= len(self.plans) or self.plans[walk[0]].step > step:
            walk = (0, np.zeros(self.sc.rows, dtype=np.int64),
                    np.array(self._origins(self.sc.resolved_origins), dtype=np.int64))
        i, wp, org = walk[0], walk[1].copy(), walk[2].copy()
        while i < len(self.plans):
            p = self.effective_plan(self.plans[i])[0]
            if p.step == step:
                self._cursor_walk = (i, wp.copy(), org.copy())
            for r, o in zip(p.reset_rows, p.reset_origins):
                wp[r], org[r] = 0, (o if self.dec.uses_ring else 0)
            if p.step == step:
                return list(zip(wp.tolist(), org.tolist()))
            wp, org = self._cursors.step(wp, org, np.asarray(p.accepted, dtype=np.int64), rows)[1:]
            i += 1
        raise ValueError(f"step: the plan has no step {step}")

    def _origins(self, origins) -> list[int]:
        """The scenario's ring origins, or zeros when the kernel's policy keeps a linear buffer."""
        return list(origins) if self.dec.uses_ring else [0] * len(origins)

    # ---- one step -------------------------------------------------------------------------------------------
    def reset_rows(self, p: StepPlan) -> None:
        """Reset the rows the plan resets (kernel, literal models, reference, cursors, envelope)."""
        if not p.reset_rows:
            return
        ids = [self.ids_list[r] if r in p.reset_rows else PAD_SLOT for r in range(self.sc.rows)]
        tids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        default = p.reset_default or self.sc.initial_state == "zeros"
        init = (torch.zeros((self.sc.rows, *self.resolved.geometry.state_shape), dtype=torch.float64,
                            device=self.device)
                if default else make_initial_state(self.resolved.inputs, generation=p.step + 1, device=self.device))
        orig = [0] * self.sc.rows
        for r, o in zip(p.reset_rows, p.reset_origins):
            orig[r] = o if self.dec.uses_ring else 0
        torig = torch.tensor(orig, dtype=torch.int64, device=self.device)
        if p.poison != "none" and self.kernel.supports_restore:
            self._poison_slots([self.ids_list[r] for r in p.reset_rows], p.poison)
        self.kernel.reset(tids, *self._reset_args(default, init, torig))
        if default:
            self.coverage["resets through the defaults (initial_state=None)"] += len(p.reset_rows)
        for lit in self.literals:
            lit.reset(tids, init, torig)
        if self.bound is not None:
            self.bound.reset(list(p.reset_rows), init)
        self.owed -= set(p.reset_rows)  # a reset drops a fold the slot owed
        for r in p.reset_rows:
            self.ref[r] = init[r]
            if self.ref_hist:
                self.ref_hist[r] = [init[r]]
            self.wp[r], self.origin[r] = 0, orig[r]
            self.cursor_table[self.ids_list[r]] = [0, orig[r]]
            for env in self.lit_env.values():
                env[r] = 0.0
        self.coverage["resets"] += len(p.reset_rows)

    # ---- driving the kernel as the plan says (the main run and the repeat run) --------------------------
    def effective_plan(self, p: StepPlan) -> tuple[StepPlan, list[int], list[int]]:
        """The plan as this kernel runs it, the rows committing k = 0 (``zero_accept = "noop"``)
        and the rows to probe (k = 0 in the plan, refusing kernel: they commit k = 1)."""
        zero_rows = [r for r in self.active if p.accepted[r] == 0]
        if not zero_rows or self.zero_noop:
            return p, zero_rows, []
        acc = [1 if r in zero_rows else a for r, a in enumerate(p.accepted)]
        return dataclasses.replace(p, accepted=acc), [], zero_rows

    def _perm(self, p: StepPlan) -> torch.Tensor:
        return torch.tensor(p.perm, dtype=torch.long, device=self.device)

    # ---- the caller's side of the serving contract (cursor table, layouts, standard steps) -------------
    def cursor_kw(self, obj) -> dict:
        """``{"cursors": table}`` for a kernel (or literal model) whose policy leaves the cursors to the caller."""
        if not self._host_owned(obj):
            return {}
        return {"cursors": torch.tensor(self.cursor_table, dtype=torch.int64, device=self.device)}

    def _host_owned(self, obj) -> bool:
        """Whether the caller owns ``obj``'s cursors: the kernel's declared policy (what it is
        driven by), a literal model's own."""
        if obj is self.kernel:
            return self.dec.host_owned
        return bool(getattr(getattr(obj, "decode", None), "host_owned", False))

    def snapshot(self, obj=None):
        """``obj.snapshot()`` (default the kernel's); under host-owned cursors with the caller's
        cursors in it (the kernel keeps none)."""
        obj = self.kernel if obj is None else obj
        snap = obj.snapshot()
        if self._host_owned(obj):
            snap.write_pos = torch.tensor([w for w, _ in self.cursor_table], dtype=torch.int64)
            snap.origin = torch.tensor([o for _, o in self.cursor_table], dtype=torch.int64)
            snap.is_flush = torch.tensor([self.dec.is_flush(w) for w, _ in self.cursor_table], dtype=torch.bool)
        return snap

    def committed_state(self, obj) -> torch.Tensor:
        """``obj.committed_state`` of the scenario's rows (with the cursor table when the caller owns it)."""
        return obj.committed_state(self.ids, **self.cursor_kw(obj))

    def lens_of(self, p: StepPlan) -> list[int] | None:
        """Each row's window length at step ``p`` (None: T' for every row): the plan's
        ``window_lens``, or 1 per active row at a standard step."""
        if p.standard:
            return [1 if s != PAD_SLOT else 0 for s in self.ids_list]
        return p.window_lens

    @staticmethod
    def standard_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A standard step's one-token inputs (window position 0 of the step's inputs)."""
        return {n: v[:, :1].contiguous() for n, v in inputs.items()}

    def kernel_verify(self, p: StepPlan, inputs: dict[str, torch.Tensor]):
        """Call the kernel's verify for step ``p`` (rows permuted as ``p.perm`` says, ``window_lens``
        when the plan has them, one-token inputs at a standard step, tokens packed with
        ``query_start_loc`` in a packed plan, the cursor table under host-owned cursors) into a
        fresh poisoned buffer: (the buffer given, what verify returned)."""
        sc, dev = self.sc, self.device
        T = 1 if p.standard else sc.window
        if p.standard:
            inputs = self.standard_inputs(inputs)
        ids, kw, pads = self.ids, {}, self.pad_rows
        lens = None if p.standard else p.window_lens
        if lens is not None:
            kw["window_lens"] = torch.tensor(lens, dtype=torch.int64, device=dev)
        if p.perm:
            idx = self._perm(p)
            ids = ids.index_select(0, idx)
            inputs = {n: v.index_select(0, idx).contiguous() for n, v in inputs.items()}
            kw = {n: v.index_select(0, idx) for n, v in kw.items()}
            pads = [i for i, r in enumerate(p.perm) if r in self.pad_rows]
        out = inv.poisoned_out(sc.rows, T, self.kernel.out_shape, self.resolved.mode.act_dtype, pads, dev)
        cur = self.cursor_kw(self.kernel)
        self.view_gaps["verify"] = []
        if p.layout == "views":
            inputs, g_in = strided_views("inputs", inputs, inv.PAD_CANARY)
            views, g_out = strided_views("out", {"out": out}, inv.PAD_CANARY)
            out = views["out"]
            ids, g_ids = column_view("slot_ids", ids, 0, self.sc.unused_slots or [PAD_SLOT])
            self.view_gaps["verify"] = [g_in, g_out, g_ids]
        if p.layout != "packed":
            self._keep_given("verify", slot_ids=ids, inputs=inputs, **kw, **cur)
            return out, self.kernel.verify(ids, inputs, out=out, **kw, **cur)
        # Packed: every row's first T'_r tokens back to back, then the unused positions (the spare tail).
        call_ids = ids.tolist()
        n_of = [0 if s == PAD_SLOT else (T if lens is None else int(kw["window_lens"][i]))
                for i, s in enumerate(call_ids)]
        used = [i * T + t for i, n in enumerate(n_of) for t in range(n)]
        spare = [i * T + t for i, n in enumerate(n_of) for t in range(n, T)]
        self._pack_idx = torch.tensor(used + spare, dtype=torch.long, device=dev)
        qsl = torch.tensor([0, *torch.tensor(n_of).cumsum(0).tolist()], dtype=torch.int64, device=dev)
        packed = {n: v.flatten(0, 1).index_select(0, self._pack_idx).contiguous() for n, v in inputs.items()}
        pout = out.flatten(0, 1).index_select(0, self._pack_idx).contiguous()
        self._keep_given("verify", slot_ids=ids, inputs=packed, query_start_loc=qsl, **cur)
        return pout, self.kernel.verify(ids, packed, out=pout, query_start_loc=qsl, **cur)

    def verify_outputs(self, p: StepPlan, got: torch.Tensor) -> torch.Tensor:
        """The kernel's outputs of step ``p`` as ``[R, T', ...]`` in scenario row order: unpacked
        (a packed plan: the spare tail back at the unused positions), a standard step's one
        position padded with the poison, rows un-permuted."""
        sc = self.sc
        T = 1 if p.standard else sc.window
        if p.layout == "packed":
            flat = torch.empty_like(got)
            flat[self._pack_idx] = got
            got = flat.reshape(sc.rows, T, *got.shape[1:])
        if p.standard:
            pads = [i for i, r in enumerate(p.perm) if r in self.pad_rows] if p.perm else self.pad_rows
            full = inv.poisoned_out(sc.rows, sc.window, got.shape[2:], got.dtype, pads, got.device)
            full[:, :1] = got
            got = full
        return self.unpermuted(p, got)

    def unpermuted(self, p: StepPlan, out: torch.Tensor) -> torch.Tensor:
        """The kernel's outputs back in scenario row order."""
        return out.index_select(0, torch.argsort(self._perm(p))) if p.perm else out

    def _keep_given(self, call: str, **given) -> None:
        """Keep the tensors handed to the kernel's ``call`` (a dict of them flattened to
        ``inputs['x']``) and, when ``watch_inputs``, a copy of their bits before the call."""
        flat = {}
        for name, v in given.items():
            if isinstance(v, dict):
                flat.update({f"{name}[{k!r}]": t for k, t in v.items()})
            elif isinstance(v, torch.Tensor):
                flat[name] = v
        self.given[call] = {n: (t, t.clone()) for n, t in flat.items()} if self.watch_inputs else {}

    def commit_counts(self, p: StepPlan) -> list[int]:
        """The accepted counts handed to ``commit`` at step ``p`` (scenario order): the plan's for
        active rows; padding rows carry garbage, as serving engines leave them (vLLM's RecoverSSM
        tests fill them at random): negative, zero, past T', huge; drawn from the scenario's seed
        and the step, so a rerun hands the same bits."""
        if not self.pad_rows:
            return list(p.accepted)
        rng = random.Random(f"pad-counts-{self.sc.seed}-{p.step}")
        T = self.sc.window
        acc = list(p.accepted)
        for r in self.pad_rows:
            acc[r] = rng.choice((-1, 0, T + 1, 2 ** 31 - 1, -2 ** 31, rng.randrange(-2 ** 31, 2 ** 31)))
        return acc

    def kernel_commit(self, p: StepPlan) -> torch.Tensor:
        """Commit ``p.accepted`` (scenario order; padding rows carry garbage, :meth:`commit_counts`)
        to the kernel, rows permuted as at the verify; returns the accepted tensor in scenario order."""
        acc = torch.tensor(self.commit_counts(p), dtype=torch.int64, device=self.device)
        ids, pacc = self.ids, acc
        if p.perm:
            idx = self._perm(p)
            ids, pacc = self.ids.index_select(0, idx), acc.index_select(0, idx)
        self.view_gaps["commit"] = []
        if p.layout == "views":
            ids, g_ids = column_view("slot_ids", ids, 0, self.sc.unused_slots or [PAD_SLOT])
            pacc, g_acc = column_view("accepted", pacc, 1, [-1])
            self.view_gaps["commit"] = [g_ids, g_acc]
        self._keep_given("commit", slot_ids=ids, accepted=pacc)
        self.kernel.commit(ids, pacc)
        for r in self.active:
            s = self.ids_list[r]
            w, o = self.cursor_table[s]
            self.cursor_table[s] = list(self.commit_cursor(w, o, self.dec.is_flush(w), p.accepted[r]))
        return acc

    def commit_cursor(self, write_pos: int, origin: int, flushed: bool, k: int) -> tuple[int, int]:
        """Cursors after commit(k) under the declared policy; a staged fold's commit(0) moves none
        (``cursor_table.commit_cursor``, the rule every cursor walk uses)."""
        return commit_cursor(self.dec, self.staged, write_pos, origin, flushed, k)

    def _literal_verify(self, lit, p: StepPlan, inputs: dict[str, torch.Tensor], kw: dict) -> torch.Tensor:
        """A literal model's verify of step ``p`` (the same call shape as the kernel's: one-token
        inputs at a standard step), as ``[R, T', ...]``."""
        if not p.standard:
            return lit.verify(self.ids, inputs, **kw, **self.cursor_kw(lit))
        one = lit.verify(self.ids, self.standard_inputs(inputs), **self.cursor_kw(lit))
        full = torch.full((self.sc.rows, self.sc.window, *one.shape[2:]), float("nan"), dtype=one.dtype,
                          device=one.device)
        full[:, :1] = one
        return full

    def _fill_window_tails(self, ctx: StepContext, lens: list[int]) -> None:
        """Positions past each active row's T'_r do not exist: ``ctx.tail`` marks them (the
        ``window-tail`` check reads ``ctx.out_raw`` there), and the outputs the value checks see,
        the kernel's and the literal models', hold the fp64 reference rounded to the activation
        dtype there."""
        T = self.sc.window
        t_idx = torch.arange(T, device=self.device)
        wl = torch.tensor([lens[r] if r in self.active else T for r in range(self.sc.rows)], device=self.device)
        ctx.tail = t_idx[None, :] >= wl[:, None]
        fill = ctx.ref_out.to(self.resolved.mode.act_dtype)
        mask = ctx.tail.view(*ctx.tail.shape, *([1] * (fill.dim() - 2))).expand_as(fill)
        ctx.out = torch.where(mask, fill, ctx.out)
        if ctx.lit_outs:
            ctx.lit_outs = [torch.where(mask, fill, x) for x in ctx.lit_outs]

    def _poison_slots(self, slots: list[int], how: str) -> None:
        """Overwrite the previous tenant's checkpoint and records of ``slots`` with NaN or 2^100
        (the largest finite value where the storage format cannot hold it; integer storage: its
        maximum), through the kernel's snapshot / restore."""
        snap = self.snapshot()

        def fill(t: torch.Tensor) -> None:
            if t.is_floating_point():
                v = float("nan") if how == "nan" else min(POISON_LARGE, float(torch.finfo(t.dtype).max))
            else:
                v = torch.iinfo(t.dtype).max
            for sl in slots:
                t[sl] = v

        fill(snap.checkpoint)
        for t in snap.records.values():
            fill(t)
        self.kernel.restore(snap)
        self.coverage[f"recycled slots poisoned ({how})"] += len(slots)

    def _reference_window(self, inputs: dict[str, torch.Tensor], accepted: list[int], flush_rows=()):
        """fp64 outputs [R, T', ...] and the state after each row's accepted prefix; the readout
        magnitudes (:func:`readout_magnitude`, [R, T', ...]) are left in ``self.ref_magnitude``,
        the fp64 running-error bounds in ``self.fp64`` (per row: ``output`` [R, T'], ``state``,
        ``checkpoint``)."""
        T = self.sc.window
        st = self.ref
        new = self.ref
        outs, mags, toks = [], [], []
        kt = torch.tensor(accepted, device=self.device)
        after_first = None
        self._toks_states: list[torch.Tensor] = []
        fam, scaled = self.resolved.family, self.resolved.mode.scaled_state
        for t in range(T):
            tok = {n: v[:, t].to(torch.float64) for n, v in inputs.items()}
            toks.append(tok)
            y, st = reference_step(fam, st, tok, self.ref_params, self.conv)
            outs.append(y)
            mags.append(readout_magnitude(fam, st, tok, self.ref_params, scaled))
            if t == 0:
                after_first = st
            if self.publish:  # the state after each window position (the materialize check's truth)
                self._toks_states.append(st)
            sel = (kt == t + 1).view(-1, *([1] * (st.dim() - 1)))
            new = torch.where(sel, st, new)
        self.ref_magnitude = torch.stack(mags, dim=1)
        self._bound_window(toks, kt, flush_rows, st)
        return torch.stack(outs, dim=1), new, after_first

    def _bound_window(self, toks: list[dict], kt: torch.Tensor, flush_rows, like: torch.Tensor) -> None:
        """Advance the fp64 running-error bound over the window into ``self.fp64`` (when there is one)."""
        if self.bound is None:
            return
        fl = torch.zeros(self.sc.rows, dtype=torch.bool, device=self.device)
        fl[list(flush_rows)] = True

        def readout(s_abs, tok):
            return readout_magnitude(self.resolved.family, s_abs, tok, self.ref_params, False)
        # a staged fold's commit(0) discards the flush's fold: the bound keeps the fold it had
        discard = (fl & (kt == 0)) if self.staged else None
        self.fp64 = self.bound.window(toks, self.ref_params, fl, self.dec.speculative, kt, like, readout,
                                      discard=discard)

    def _golden_window(self, ctx: StepContext, inputs: dict[str, torch.Tensor], p: StepPlan, flush_rows):
        """The truth of step ``p`` from the golden data (no reference recurrence): on a stored step
        the stored outputs and committed state (``ctx.ref_out``, ``ctx.ref_state``, zeros past the
        stored elements), the literal models' outputs and ``ctx.state_mask`` for the state check;
        otherwise none.  The fp64 bound advances as usual.  Returns the kernel's active outputs to
        judge (its value past the stored elements replaced by the truth's placeholder) or None."""
        toks = [{n: v[:, t].to(torch.float64) for n, v in inputs.items()} for t in range(self.sc.window)]
        self._bound_window(toks, torch.tensor(p.accepted, device=self.device), flush_rows, self.ref)
        if p.step not in self.golden.steps:
            return None
        act = self.active_idx
        ctx.ref_out, mask, ctx.ref_magnitude = self.golden.outputs(p.step, ctx.out)
        ctx.ref_state, ctx.state_mask = self.golden.state(p.step, self.ref)
        if ctx.lit_outs:
            ctx.lit_outs = [masked(x, mask, ctx.ref_out) for x in ctx.lit_outs]
        return masked(ctx.o_act, mask.index_select(0, act), ctx.ref_out.index_select(0, act))

    def step(self) -> dict:
        """Run the next planned step, phase by phase in :data:`STEP`'s order (:meth:`run_phases`);
        returns its record (per-step metrics as floats when ``record_metrics``; failures are added to
        the run).  ``self.last_step`` keeps the step's device tensors for callers that accumulate
        without host syncs (drift): ``plan``, ``inputs``, ``out``, ``ref_out``, ``max_abs`` /
        ``rel_l2`` ``[rows, T']`` (NaN for padding rows), ``flush_rows``."""
        if not self.started:
            self.start()
        if self.step_idx >= len(self.plans):
            raise ValueError(f"step: the plan has {len(self.plans)} steps, all run")
        st = StepState(*self.effective_plan(self.plans[self.step_idx]))
        self.run_phases(st)
        return self._close_step(st)

    # ---- the phases of one step (STEP) ----------------------------------------------------------------------
    def phase_reset(self, st: StepState) -> None:
        """Reset the rows the plan resets."""
        self.reset_rows(st.p)

    def phase_inputs(self, st: StepState) -> None:
        """The step's inputs and the checks due (what they need)."""
        st.inputs = make_inputs(self.resolved.inputs, st.p.step, self.device)
        st.due = self._due(st.p.step, last=self.step_idx == len(self.plans) - 1)
        st.needs = self._needs(st.due)
        self.watch_inputs = "inputs" in st.needs
        st.use_lit = "literal" in st.due

    def phase_verify(self, st: StepState) -> None:
        """The verify's bookkeeping (flush rows, envelope, coverage, phases), the kernel's verify (its
        ``verify-returned`` checks at once, on what it returned), the snapshots and checkpoint its checks need."""
        p, due, needs, sc = st.p, st.due, st.needs, self.sc
        st.flush_rows = flush_rows = [r for r in self.active if self.dec.is_flush(self.wp[r])]
        self.count_flushes(flush_rows)
        fl = np.zeros((1, sc.rows), dtype=bool)
        fl[0, flush_rows] = True
        self.book_verifies(np.array([self.wp]), np.array([self.origin]), fl, np.array([p.accepted]))
        st.ctx = ctx = StepContext(self, p, st.inputs, flush_rows, use_literal=st.use_lit, record={"step": p.step})
        if self.next_verify:  # the rows this verify may rewrite the checkpoint of: those owing a fold
            ctx.fold_rows = [r for r in self.active if r in self.owed]
        ctx.zero_rows, ctx.probe_rows = st.zero_rows, st.probe_rows
        if "before-verify" in needs:
            ctx.snapshots["before-verify"] = self.snapshot()
        # the kernel's batch rows in the plan's order, when it permutes them
        ctx.out_given, ctx.returned = self.kernel_verify(p, st.inputs)
        self.run_checks("verify-returned", ctx, due)
        ctx.out = self.verify_outputs(p, ctx.out_given if ctx.returned is None else ctx.returned)
        st.lens = lens = self.lens_of(p)
        st.lit_kw = {} if p.window_lens is None or p.standard else {
            "window_lens": torch.tensor(p.window_lens, dtype=torch.int64, device=self.device)}
        if p.perm:
            self.coverage["permuted batches"] += 1
        if p.layout == "packed":
            self.coverage["packed verifies"] += 1
        if p.standard:
            self.coverage["standard steps on speculative slots"] += 1
        self.tokens_verified += (sum(lens[r] for r in self.active) if lens is not None
                                 else len(self.active) * sc.window)
        at_flush = bool(flush_rows) and any(c.schedule in due for c in self.hooks["at-flush"])
        st.staged_flush = at_flush and self.staged
        st.deferred_flush = at_flush and self.next_verify
        if "after-verify" in needs or (st.deferred_flush and "before-verify" in needs):
            ctx.snapshots["after-verify"] = self.snapshot()
        st.at_flush = at_flush and not (st.staged_flush or st.deferred_flush)
        if st.at_flush and "checkpoint" in needs:
            ctx.checkpoint = self.kernel.checkpoint_state(self.ids)

    def phase_reference(self, st: StepState) -> None:
        """The literal models and the fp64 reference on the same window (a fold owed to this verify
        judged first), the window tails, the output metrics."""
        p, ctx, use_lit, needs = st.p, st.ctx, st.use_lit, st.needs
        ctx.lit_outs = ([self._literal_verify(lit, p, st.inputs, st.lit_kw) for lit in self.literals]
                        if use_lit else None)
        if use_lit and ctx.checkpoint is not None:
            ctx.lit_checkpoints = [lit.checkpoint_state(self.ids) for lit in self.literals]
        self._deferred_flush_checks(ctx, use_lit)
        if st.deferred_flush and use_lit and "checkpoint" in needs:  # the literal models that fold at the flush
            st.lit_folded = [None if getattr(lit, "fold_at", "flush") == "next-verify"
                             else lit.checkpoint_state(self.ids) for lit in self.literals]
        ctx.out_raw = ctx.out
        act = self.active_idx
        if self.golden is None:
            ctx.ref_state_before = self.ref
            ctx.ref_out, ctx.ref_state, ctx.ref_first = self._reference_window(st.inputs, p.accepted, st.flush_rows)
            ctx.ref_magnitude = self.ref_magnitude
        else:  # (ragged plans are refused with golden truth)
            o_judged = self._golden_window(ctx, st.inputs, p, st.flush_rows)
        ctx.fp64 = self.fp64 if self.bound is not None else None
        if st.lens is not None:
            self._fill_window_tails(ctx, st.lens)
        if self.golden is None:  # (after the tails are filled: o_act is computed once)
            o_judged = ctx.o_act
        m = st.metrics = ctx.metrics = ({} if o_judged is None else
                                          error_metrics(o_judged, ctx.ref_out.index_select(0, act),
                                                        self.rule.u_out, lead=2))
        if m:
            ctx.device_record.update({"max_abs": m["max_abs"].amax(), "rel_l2": m["rel_l2"].amax(),
                                      "rms_ratio": m["rms_ratio"], "in_u": m["in_u"].amax()})

    def phase_verify_checks(self, st: StepState) -> None:
        """The verify's checks: after-verify, then at-flush (a flush folded at this verify)."""
        self.run_checks("after-verify", st.ctx, st.due)
        if st.at_flush:
            self.run_checks("at-flush", st.ctx, st.due)

    def phase_commit(self, st: StepState) -> None:
        """The kernel's commit (and the literal models'), the cursors, a staged fold's flush checks,
        the fold owed to the next verify, the reference's committed state."""
        p, ctx = st.p, st.ctx
        acc = self.kernel_commit(p)
        if st.use_lit:
            for lit in self.literals:
                lit.commit(self.ids, acc)
        moves = self.dec.rule.checkpoint_moves_at_commit(self.dec)
        for r in self.active:
            held = self.wp[r] + p.accepted[r]
            self.wp[r], self.origin[r] = self.commit_cursor(self.wp[r], self.origin[r], r in st.flush_rows,
                                                            p.accepted[r])
            if moves and p.accepted[r] and self.wp[r] != held:  # the commit folded: one more checkpoint rounding
                self.lit_env["flushes"][r] += 1
                self.coverage["commit folds"] += 1
            self.tokens_accepted += p.accepted[r]
        if st.staged_flush:
            self._staged_flush_checks(ctx, p, st.flush_rows, st.due, st.needs, st.use_lit)
        if self.next_verify:
            self.owed = set(st.flush_rows)
            self.deferred = (ctx, st.due, st.needs, st.lit_folded) if st.deferred_flush else None
        if self.golden is None:
            self.ref = ctx.ref_state
            if self.publish:
                self._extend_ref_hist(p)
        if "after-commit" in st.needs:
            ctx.snapshots["after-commit"] = self.snapshot()

    def phase_commit_checks(self, st: StepState) -> None:
        """The commit's checks (after-commit)."""
        self.run_checks("after-commit", st.ctx, st.due)

    def _close_step(self, st: StepState) -> dict:
        """The step's record, digest and ``last_step``; the plan moves on."""
        sc, dev, ctx, m = self.sc, self.device, st.ctx, st.metrics
        rec = ctx.record
        if self.digest is not None:
            self.digest.update(ctx.out_raw)
        full_max = torch.full((sc.rows, sc.window), float("nan"), dtype=torch.float64, device=dev)
        full_rel = full_max.clone()
        if m:
            full_max[self.active_idx], full_rel[self.active_idx] = m["max_abs"], m["rel_l2"]
        self.last_step = {"plan": st.p, "inputs": st.inputs, "out": ctx.out, "ref_out": ctx.ref_out,
                          "max_abs": full_max, "rel_l2": full_rel, "flush_rows": st.flush_rows}
        if self.record_metrics:
            dev_rec = ctx.device_record
            names = list(dev_rec)
            if names:
                rec.update(zip(names, torch.stack([dev_rec[n].to(torch.float64) for n in names]).tolist()))
            for key in self.metrics:
                self.metrics[key].append(rec.get(key))
        self.step_idx += 1
        return rec

    def _extend_ref_hist(self, p: StepPlan) -> None:
        """Append each active row's reference states after its accepted tokens to ``ref_hist``
        (the states of the committed history; the oldest beyond max write_pos + 1 dropped)."""
        keep = self.dec.max_write_pos() + 1
        for r in self.active:
            hist = self.ref_hist[r] + [self._toks_states[t][r] for t in range(p.accepted[r])]
            self.ref_hist[r] = hist[-keep:]

    def _staged_flush_checks(self, ctx: StepContext, p: StepPlan, flush_rows: list[int], due: set[str], needs: set[str],
                             use_lit: bool) -> None:
        """A staged fold's flush checks, after the commit that applied it: the at-flush checks on
        the flush rows that accepted k >= 1 (the rows with k = 0 discarded it: ``staged-fold``)."""
        rows = [r for r in flush_rows if p.accepted[r] >= 1]
        if not rows:
            return
        if "checkpoint" in needs:
            ctx.checkpoint = self.kernel.checkpoint_state(self.ids)
            if use_lit:
                ctx.lit_checkpoints = [lit.checkpoint_state(self.ids) for lit in self.literals]
        self.run_checks("at-flush", dataclasses.replace(ctx, flush_rows=rows), due)

    def _deferred_flush_checks(self, ctx: StepContext | None, use_lit: bool) -> None:
        """A fold at the next verify: the at-flush checks of the last flush step, now that this
        verify (the next of its rows) has folded: the checkpoint after it, on the flush's rows that
        still owed the fold (not reset since), with the flush's window, reference and storage; the
        literal models that fold at the next verify too give their checkpoint now."""
        if self.deferred is None:
            return
        fctx, due, needs, lit_folded = self.deferred
        self.deferred = None
        rows = [r for r in fctx.flush_rows if r in self.owed]
        if not rows:
            return
        kw: dict = {"flush_rows": rows}
        if "after-verify" in fctx.snapshots:
            # the storage the owed fold starts from: the flush verify's (the fold its own verify owed applied,
            # the committed history and cursors as before it)
            kw["snapshots"] = {**fctx.snapshots, "before-verify": fctx.snapshots["after-verify"]}
        if "checkpoint" in needs:
            kw["checkpoint"] = self.kernel.checkpoint_state(self.ids)
            lits = None
            if lit_folded is not None and (use_lit or all(x is not None for x in lit_folded)):
                lits = [x if x is not None else lit.checkpoint_state(self.ids)
                        for x, lit in zip(lit_folded, self.literals)]
            kw["lit_checkpoints"] = lits
        self.coverage["flush folds judged at the next verify"] += len(rows)
        self.run_checks("at-flush", dataclasses.replace(fctx, **kw), due)

    def judge_owed_folds(self, why: str) -> None:
        """A fold at the next verify still owed (the last flush's, at the end of the run or when the run
        is checkpointed for a resume, which cannot keep the flush's context): one closing verify of the
        kernel and the literal models on the next step's inputs folds it, the flush's checks judge the
        checkpoint after it, and every model is restored to its snapshot, so the run goes on (or ends)
        as if the probe had not been made.  A kernel that cannot restore snapshots, or whose closing
        verify raises, leaves the fold unjudged, counted and said in the notes (never a silent pass)."""
        if self.deferred is None:
            return
        rows = [r for r in self.deferred[0].flush_rows if r in self.owed]
        if not rows:
            self.deferred = None
            return
        models = [self.kernel, *self.literals]
        if not all(getattr(m, "supports_restore", False) for m in models):
            self.deferred = None
            self.coverage["flush folds left unjudged"] += len(rows)
            self.notes.append(f"{len(rows)} fold(s) owed to a next verify at {why} left unjudged: the kernel "
                              f"cannot restore snapshots, so no closing verify was made")
            return
        snaps = [m.snapshot() for m in models]
        nxt = self.plans[self.step_idx].step if self.step_idx < len(self.plans) else self.plans[-1].step + 1
        inputs = make_inputs(self.resolved.inputs, nxt, self.device)
        try:
            for m in models:
                out = inv.poisoned_out(self.sc.rows, self.sc.window, m.out_shape, self.resolved.mode.act_dtype,
                                       self.pad_rows, self.device)
                m.verify(self.ids, inputs, out=out, **self.cursor_kw(m))
            self._deferred_flush_checks(None, True)  # (counted as judged at the next verify: the probe is one)
        except Exception as e:  # noqa: BLE001 - the probe is not part of the scenario: said, not judged
            self.deferred = None
            self.coverage["flush folds left unjudged"] += len(rows)
            self.notes.append(f"{len(rows)} fold(s) owed to a next verify at {why} left unjudged: the closing "
                              f"verify raised {type(e).__name__}: {' '.join(str(e).split())[:160]}")
        finally:
            for m, snap in zip(models, snaps):
                m.restore(snap)

    def finish(self, kernel, step_digests: list[str], exception: dict | None = None, repeat: bool = True) -> None:
        """Run the end-of-run checks: ``kernel`` (a name or a class) builds the fresh instance of
        the repeat run; ``step_digests`` are the chained output digests after each step run.  A fold
        still owed to a next verify is judged first (:meth:`judge_owed_folds`)."""
        if exception is None:
            self.judge_owed_folds("the end of the run")
        ctx = RunContext(self, kernel, step_digests, exception, repeat)
        due = {"once"}
        if repeat and exception is None and self.step_idx:
            due.add("repeat")
        for c in self.hooks["end-of-run"]:
            if c.schedule in due:
                c.run(ctx)
                self.ran_at_end.append(c.name)

    # ---- checkpoint / resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume this run (CPU tensors; torch.save-able)."""
        if not self.started:
            self.start()
        self.judge_owed_folds("a checkpoint of the run")
        return {
            "scenario": self.sc.to_json(),
            "kernel": self.kernel_name,
            "step_idx": self.step_idx,
            "kernel_snapshot": inv.snapshot_to_dict(self.kernel.snapshot()),
            "literal_snapshot": None if self.literal is None else inv.snapshot_to_dict(self.literal.snapshot()),
            "replica_snapshots": [inv.snapshot_to_dict(x.snapshot()) for x in self.replicas],
            "ref": self.ref.detach().cpu(),
            "wp": list(self.wp), "origin": list(self.origin),
            "owed": sorted(self.owed),  # (a fold at the next verify; its checks ran at judge_owed_folds)
            "canary": {s: {k: v.cpu() for k, v in d.items()} for s, d in self.canary.items()},
            "digest": None if self.digest is None else self.digest.hex,
            "failures": [vars(f) for f in self.failures], "failure_counts": dict(self.failure_counts),
            "marginals": [vars(f) for f in self.marginals], "marginal_counts": dict(self.marginal_counts),
            "metrics": {k: list(v) for k, v in self.metrics.items()},
            "coverage": dict(self.coverage), "phases": sorted(self.phases),
            "tokens": (self.tokens_accepted, self.tokens_verified), "notes": list(self.notes),
            "lit_env": {k: v.detach().cpu() for k, v in self.lit_env.items()},
            "fp64_bound": None if self.bound is None else self.bound.state_dict(),
        }

    def load_state_dict(self, d: dict) -> None:
        """Resume from :meth:`state_dict` (same scenario; the kernel must support ``restore``)."""
        if Scenario.from_json(d["scenario"]) != self.sc:
            raise ValueError("state_dict: it was taken from a different scenario")
        if not getattr(self.kernel, "supports_restore", False):
            raise ValueError(f"state_dict: kernel {self.kernel_name!r} cannot restore snapshots; rerun from the start")
        self.kernel.restore(inv.snapshot_from_dict(d["kernel_snapshot"]))
        if self.literal is not None:
            if d["literal_snapshot"] is None:
                raise ValueError("state_dict: it has no literal-model snapshot; "
                                 "build the Lockstep with literal_every=0")
            self.literal.restore(inv.snapshot_from_dict(d["literal_snapshot"]))
            reps = d.get("replica_snapshots", [])
            if len(reps) != len(self.replicas):
                raise ValueError(f"state_dict: it has {len(reps)} stochastic-rounding replica snapshots, "
                                 f"this run needs {len(self.replicas)}")
            for x, snap in zip(self.replicas, reps):
                x.restore(inv.snapshot_from_dict(snap))
        self.step_idx = int(d["step_idx"])
        self.ref = d["ref"].to(self.device)
        self.wp, self.origin = list(d["wp"]), list(d["origin"])
        self.owed, self.deferred = set(d.get("owed", [])), None
        self.canary = {int(s): dict(v) for s, v in d["canary"].items()}
        if self.digest is not None:
            self.digest = inv.RunDigest(d["digest"] or "")
        self.failures = [Failure(**f) for f in d["failures"]]
        self.failure_counts = Counter(d["failure_counts"])
        self.marginals = [Failure(**f) for f in d.get("marginals", [])]
        self.marginal_counts = Counter(d.get("marginal_counts", {}))
        self.metrics = {k: [] for k in ("step", *METRICS)} | {k: list(v) for k, v in d["metrics"].items()}
        self.coverage = Counter(d["coverage"])
        self.phases = {tuple(x) for x in d["phases"]}
        self.tokens_accepted, self.tokens_verified = d["tokens"]
        self.notes = list(d["notes"])
        for k, v in d.get("lit_env", {}).items():
            self.lit_env[k] = v.to(self.device)
        if self.bound is not None and d.get("fp64_bound") is not None:
            self.bound.load_state_dict(d["fp64_bound"])
        self.started = True

    def _when(self, schedule: str) -> str:
        return {"every-step": "every step", "invariants": f"every {self.invariants_every} step(s) and the last",
                "literal": f"every {self.literal_every} step(s), vs {self.literal_name}",
                "state": f"every {self.state_every} step(s) and the last", "every-flush": "at every flush",
                "once": "end of run", "repeat": "end of run"}[schedule]

    # ---- result -------------------------------------------------------------------------------------------------
    def result(self, wall_s: float = 0.0, exception: dict | None = None) -> ValidationResult:
        sc = self.sc
        res = ValidationResult(kernel=self.kernel_name, family=sc.family, mode=sc.mode, scenario=sc.to_dict(),
                               literal=self.literal_name, steps_planned=len(self.plans), steps_run=self.step_idx,
                               tokens_accepted=self.tokens_accepted, tokens_verified=self.tokens_verified,
                               wall_s=wall_s, failures=sorted(self.failures, key=lambda f: f.sort_key),
                               failure_counts=dict(self.failure_counts), exception=exception,
                               device=str(self.device),
                               conventions=self.conv.label(self.resolved.family.conventions))
        res.metrics = {k: v for k, v in self.metrics.items() if any(x is not None for x in v)}
        summ = {}
        for key in METRICS:
            vals = [x for x in self.metrics.get(key, []) if x is not None]
            if vals:
                summ[f"worst {key}"] = max(vals)
        res.summary = summ
        hi = self.dec.max_write_pos()
        want = {(w, kk) for w in range(hi + 1) for kk in range(1, sc.window + 1)}
        res.coverage = {**dict(self.coverage),
                        "(write_pos, k) pairs": f"{len(self.phases & want)}/{len(want)}"}
        res.checks = [f"{c.name} ({self._when(c.schedule)})" for c in CHECKS.values()
                      if c.applies(self.kind) and self._enabled(c.schedule)
                      and (c.schedule not in ("once", "repeat") or c.name in self.ran_at_end)]
        res.notes = list(self.notes)
        if self.poison_allocations:
            res.notes.append(f"allocations poisoned ({self.poison_allocations}): every torch.empty / empty_like / "
                             f"new_empty buffer of the kernel's reset, verify and commit calls was filled")
        if not sc.unused_slots:
            res.notes.append("no unused slots: the canary (unused-slot) check had nothing to watch")
        if not self.pad_rows:
            res.notes.append("no padding rows: padding-row handling was not exercised")
        if self.literal is None:
            res.notes.append("no literal model at this mode: the tolerance rule was not applied to outputs")
        if self.golden is not None:
            g = self.golden
            res.notes.append(f"truth: golden {g.stem} (golden/trajectories, sha256-checked): outputs and committed "
                             f"states judged at steps {', '.join(map(str, g.steps))} on the stored elements "
                             f"(at most {g.keep} per row); flush checkpoints and the other steps have no stored truth")
        res.marginals = sorted(self.marginals, key=lambda f: f.sort_key)
        res.marginal_counts = dict(self.marginal_counts)
        res.margin = self.margin()
        res.marginal_factor = self.marginal_factor
        res.verdict = "fail" if self.failure_counts or exception is not None else (
            "marginal" if self.marginal_counts else "pass")
        res.passed = res.verdict != "fail"
        return res

    def margin(self) -> dict | None:
        """The worst ratio of error to bound over the banded checks (``{"ratio", "check", "step"}``,
        with ``row`` and ``position`` where a reported error gives them), or None when no banded
        check measured a ratio: the steps' recorded ratios and the reported errors, the worst."""
        best = None
        for key, check in BANDED_METRICS.items():
            for step, r in zip(self.metrics["step"], self.metrics.get(key, [])):
                if r is not None and math.isfinite(r) and (best is None or r > best["ratio"]):
                    best = {"ratio": float(r), "check": check, "step": step}
        for f in (*self.marginals, *self.failures):
            r = f.ratio
            if r is not None and CHECKS.get(f.check) is not None and CHECKS[f.check].banded and (
                    best is None or r >= best["ratio"]):
                best = {"ratio": r, "check": f.check, "step": f.step, "row": f.row, "position": f.position}
        return best


def _exception_record(step: int, e: BaseException) -> dict:
    return {"step": step, "type": type(e).__name__, "message": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}


def run_scenario(sc: Scenario | ResolvedScenario, kernel, *, device="cpu", progress: bool = False,
                 repeat_check: bool = True, literal_every: int = 1, invariants_every: int = 1, state_every: int = 1,
                 stop_on_failure: bool = False, max_failures: int = 200, truth: str = "reference",
                 poison_allocations: str | None = None, marginal_factor: float | None = None) -> ValidationResult:
    """Validate ``kernel`` (registered name, class, or a zero-argument factory of fresh instances is not
    needed: names and classes are rebuilt for the repeat run) on ``sc``; never raises for a kernel
    error: exceptions are recorded in the result with the step they happened at.  ``poison_allocations``
    (``"nan"`` | ``"large"``): every empty-like buffer the kernel allocates in its reset / verify /
    commit calls is filled with that poison (validators/engine/poison_alloc.py), the repeat run's too.
    ``marginal_factor``: the marginal band of the banded checks (default ``tolerances.marginal_factor``
    of the mode; 1: none, every error above the bound fails)."""
    r = resolve(sc, kernel, device)  # the door: every name of the scenario resolved once (ValueError naming it)
    for name, v in (("invariants_every", invariants_every), ("state_every", state_every)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r} (0 would switch checks off; no option "
                             f"does: a larger n samples them, every flush and the last step are always judged)")
    if isinstance(kernel, KernelUnderTest) and repeat_check:
        raise ValueError("kernel: pass a registered name or a class so the repeat check can build a fresh instance "
                         "(or repeat_check=False)")
    ls = Lockstep(r, kernel, device=r.device, literal_every=literal_every, invariants_every=invariants_every,
                  state_every=state_every, max_failures=max_failures, truth=truth,
                  poison_allocations=poison_allocations, marginal_factor=marginal_factor)
    n = len(ls.plans)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="step", desc=f"{ls.kernel_name} {r.sc.family} {r.sc.mode}", leave=False)
    exc = None
    step_digests = []
    t0 = time.perf_counter()
    try:
        while ls.step_idx < n:
            ls.step()
            step_digests.append(ls.digest.hex)
            if bar is not None:
                bar.update(1)
                el = time.perf_counter() - t0
                bar.set_postfix_str(f"{ls.tokens_accepted / max(el, 1e-9):,.0f} tok/s", refresh=False)
            if stop_on_failure and ls.failure_counts:
                ls.notes.append(f"stopped at the first failing step ({ls.step_idx - 1}) as asked")
                break
    except Exception as e:  # noqa: BLE001 - a kernel error is a result, not a crash
        exc = _exception_record(ls.plans[ls.step_idx].step if ls.step_idx < n else ls.step_idx, e)
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    ls.finish(kernel if isinstance(kernel, str) else type(ls.kernel), step_digests, exc, repeat=repeat_check)
    return ls.result(wall_s=wall, exception=exc)


__all__ = ["SR_REPLICAS", "SR_WALK_CAP", "Lockstep", "ResolvedScenario", "build_kernel", "declared_policy",
           "kernel_conventions", "literal_twin_name", "reference_step", "resolve", "run_scenario"]
