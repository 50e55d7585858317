"""Drive a kernel through a scenario, step by step, beside the fp64 reference and the literal model.

Oracle (spec 6): the fp64, non-speculative, token-by-token recurrence of spec 2 on the accepted
token stream, fed the same inputs (sampled in the activation dtype, upcast exactly).  Window
position s of every verify is compared with the reference run on committed prefix +
window[0..s], drafts included; after each commit the kernel's committed state is compared with
the reference state after the accepted prefix; at every flush its checkpoint is compared with
the reference state at the folded token count.  Tolerances come from
``validators/tolerances.py`` (err <= factor x literal-model error at the same mode + floor); the
exact invariants from ``validators/invariants.py``.

:class:`Lockstep` is the step-level engine (the drift helper builds on it; ``state_dict`` /
``load_state_dict`` checkpoint and resume it); :func:`run_scenario` runs a whole scenario,
repeats it for the bit-identity check and returns a :class:`ValidationResult`.

The reference is batched over rows on the kernel's device in fp64 (no per-element Python loops).
The literal model (per-row Python) is only needed for the tolerance rule: ``literal_every``
samples it (0 turns it off: then only exact checks and metrics are reported).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import Counter

import torch

from replayssm.interface import PAD_SLOT, KernelConfig, KernelSnapshot, KernelUnderTest
from replayssm.ops.gdn.naive import gdn_step
from replayssm.ops.mamba2.naive import mamba2_step
from replayssm.registry import get
from replayssm.scenarios.inputs import make_initial_state, make_inputs, make_params
from replayssm.scenarios.scenario import Scenario
from replayssm.scenarios.schedules import StepPlan, plan
from replayssm.validators import invariants as inv
from replayssm.validators import mutants  # noqa: F401 - registers every mutant by name
from replayssm.validators.metrics import error_metrics
from replayssm.validators.result import Failure, ValidationResult
from replayssm.validators.tolerances import bound, output_unit, state_unit, tolerance_for

CANARY_GENERATION = 1 << 40
# With stochastic rounding the literal model's error is a random draw: the bound uses the running
# maximum over the literal and this many replicas with other rounding seeds (fp8 SR with long
# memory: independent streams drift several ulps apart, docs/fuzzing.md).
SR_REPLICAS = 2
# ... and the floor grows like a random walk of one rounding per flush, up to this many flushes
# (later the replicas' running envelope has seen enough of the noise).
SR_WALK_CAP = 8


def reference_step(family: str, state: torch.Tensor, tok: dict[str, torch.Tensor], params: dict[str, torch.Tensor]):
    """One fp64 recurrence step (spec 2) for all rows: returns (output, new state)."""
    if family == "mamba2":
        return mamba2_step(state, tok["x"], tok["dt"], tok["B"], tok["C"], params["A"], params["dt_bias"],
                           params["D"], tok.get("z"))
    return gdn_step(state, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], params["A_log"], params["dt_bias"])


def readout_magnitude(family: str, state: torch.Tensor, tok: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
                      scaled: bool) -> torch.Tensor:
    """The magnitude of the terms each output sums (the condition of the readout), per output
    element: Mamba-2 ``sum_n |S_pn| |C_n| + |D x|`` (times the |z gate|), GDN ``sum_k |S_vk| |q_k|``;
    for per-row scaled states (fp8/int8, error relative to the row's max) ``|S|`` is the row's max.
    Rounding the state by u moves an output by up to u times this, however small the output is
    after cancellation: the tolerance floor is relative to it (found by the fuzzer, issue 6)."""
    S = state.abs()
    if scaled:
        S = S.amax(-1, keepdim=True).expand_as(S)
    if family == "mamba2":
        H = S.shape[-3]
        C = tok["C"].abs().repeat_interleave(H // tok["C"].shape[-2], dim=-2)
        mag = (S * C[..., None, :]).sum(-1) + (params["D"][..., None] * tok["x"]).abs()
        if tok.get("z") is not None:
            z = tok["z"]
            mag = mag * (z * torch.sigmoid(z)).abs()
        return mag
    from replayssm.ops.gdn.naive import gdn_prepare
    qh, _ = gdn_prepare(tok["q"], tok["k"], S.shape[-3])
    return (S * qh.abs()[..., None, :]).sum(-1)


def literal_twin_name(cls: type[KernelUnderTest], sc: Scenario) -> str | None:
    """The literal model a kernel is compared with: ``cls.literal_twin`` if set, else the literal
    baseline for baseline kernels and the literal replay model otherwise; None when it cannot run
    the scenario's mode."""
    name = getattr(cls, "literal_twin", None) or ("literal-baseline" if cls.kind == "baseline" else "literal-replay")
    for cand in (name, "literal-replay"):
        try:
            lit = get(cand, sc.family)
        except ValueError:
            continue
        if lit.unsupported_reason(sc.precision, sc.decode_config, dict(sc.kernel_options)) is None:
            return cand
    return None


def build_kernel(kernel, sc: Scenario, device, params=None) -> KernelUnderTest:
    """A kernel for ``sc``: a registered name, a KernelUnderTest subclass, or an instance."""
    if isinstance(kernel, KernelUnderTest):
        return kernel
    cls = get(kernel, sc.family) if isinstance(kernel, str) else kernel
    if not (isinstance(cls, type) and issubclass(cls, KernelUnderTest)):
        raise ValueError(f"kernel: expected a registered name, a KernelUnderTest subclass or instance, got {kernel!r}")
    if params is None:
        params = make_params(sc)
    cfg = KernelConfig(sc.geometry_obj, {k: v.to(device) for k, v in params.items()}, sc.precision,
                       sc.decode_config, num_slots=sc.num_slots, device=torch.device(device),
                       options=dict(sc.kernel_options))
    return cls(cfg)


class Lockstep:
    """Step-level engine: the kernel under test, the literal model and the fp64 reference in lockstep.

    ``kernel``: registered name, KernelUnderTest subclass, or an instance built for ``sc``
    (a fresh instance each run).  ``literal_every``: run the literal model (tolerance rule) every
    n-th step (0: never).  ``invariants_every``: snapshot-based exact checks every n-th step
    (0: never).  ``state_every``: committed-state check every n-th step (flush checks always run
    when invariants or state checks run on that step).  ``max_failures``: failures kept in full
    (all are counted).
    """

    def __init__(self, sc: Scenario, kernel, *, device="cpu", literal_every: int = 1, invariants_every: int = 1,
                 state_every: int = 1, max_failures: int = 200, record_metrics: bool = True, digest: bool = True,
                 steps: list[StepPlan] | None = None) -> None:
        for name, v in (("literal_every", literal_every), ("invariants_every", invariants_every),
                        ("state_every", state_every)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {v!r}")
        self.sc = sc
        self.device = torch.device(device)
        self.params = make_params(sc)
        self.kernel = build_kernel(kernel, sc, self.device, self.params)
        if self.kernel.geometry != sc.geometry_obj or self.kernel.mode != sc.precision:
            raise ValueError(f"kernel: instance was built for {self.kernel.geometry} {self.kernel.mode.id}, "
                             f"the scenario needs {sc.geometry_obj} {sc.mode}")
        self.kernel_name = self.kernel.name or type(self.kernel).__name__
        self.literal_name = literal_twin_name(type(self.kernel), sc) if literal_every else None
        self.literal = build_kernel(self.literal_name, sc, self.device, self.params) if self.literal_name else None
        self.literal_every = literal_every if self.literal is not None else 0
        self.replicas = []
        if self.literal is not None and sc.precision.rounding == "stochastic":
            for i in range(1, SR_REPLICAS + 1):
                rsc = sc.replace(mode=dataclasses.replace(sc.precision, seed=sc.precision.seed + 7919 * i).id)
                self.replicas.append(build_kernel(self.literal_name, rsc, self.device, self.params))
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
        self.ref_params = {k: v.to(self.device, torch.float64) for k, v in self.params.items()}
        self.dec = sc.decode_config
        # A mutant built on a baseline says so in ``base_kind`` (its kind is "mutant").
        self.replay_kind = getattr(self.kernel, "base_kind", self.kernel.kind) != "baseline"
        self.tol = tolerance_for(sc.precision)
        self.u_out = output_unit(sc.precision)
        self.u_state = state_unit(sc.precision)
        self.step_idx = 0
        self.started = False
        self.digest = inv.RunDigest() if digest else None
        self.failures: list[Failure] = []
        self.failure_counts: Counter = Counter()
        self.metrics: dict[str, list] = {k: [] for k in (
            "step", "max_abs", "rel_l2", "rms_ratio", "in_u", "literal_max_abs", "bound_ratio", "state_err",
            "state_bound_ratio")}
        self.coverage: Counter = Counter()
        self.phases: set = set()
        self.tokens_accepted = 0
        self.tokens_verified = 0
        self.notes: list[str] = []
        self.canary: dict[int, dict[str, torch.Tensor]] = {}
        # Stochastic rounding: the literal model's error is one random draw of the mode's noise; the
        # bound uses the running maximum (literal and replicas) per row since the row's last reset.
        self.sr_envelope = sc.precision.rounding == "stochastic"
        self.lit_env = {"output": torch.zeros(sc.rows, dtype=torch.float64, device=self.device),
                        "state": torch.zeros(sc.rows, dtype=torch.float64, device=self.device),
                        "flushes": torch.zeros(sc.rows, dtype=torch.float64, device=self.device)}

    def _sr_walk(self, idx: torch.Tensor) -> torch.Tensor:
        """Per row: sqrt(1 + flushes since reset) with stochastic rounding (independent rounding
        streams drift apart like random walks of one rounding per flush), else 1."""
        if not self.sr_envelope:
            return torch.ones(len(idx), dtype=torch.float64, device=self.device)
        return torch.sqrt(1.0 + self.lit_env["flushes"].index_select(0, idx).clamp(max=SR_WALK_CAP))

    @property
    def literals(self) -> list[KernelUnderTest]:
        """The literal model and its stochastic-rounding replicas (empty without a literal)."""
        return [] if self.literal is None else [self.literal, *self.replicas]

    # ---- failures ---------------------------------------------------------------------------------------
    def fail(self, step: int, check: str, message: str, **where) -> None:
        self.failure_counts[check] += 1
        if len(self.failures) < self.max_failures:
            self.failures.append(Failure(step=step, check=check, message=message, **where))

    # ---- setup --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Fill unused slots with canary data, reset the scenario's rows, snapshot the canaries."""
        sc, k = self.sc, self.kernel
        unused = sc.unused_slots
        if unused:
            csc = sc.replace(rows=len(unused), slot_ids=tuple(unused), origins=None, schedule="always-1",
                             schedule_params={}, steps=None, initial_state="random")
            cids = torch.tensor(unused, dtype=torch.int64, device=self.device)
            cinit = make_initial_state(csc, generation=CANARY_GENERATION, device=self.device)
            corig = None
            if self.dec.speculative:
                corig = torch.tensor([(3 + 5 * i) % sc.ring_rows for i in range(len(unused))], dtype=torch.int64,
                                     device=self.device)
            k.reset(cids, cinit, corig)
            k.verify(cids, make_inputs(csc, 0, self.device, stream="canary"))
            k.commit(cids, torch.full((len(unused),), min(2, sc.window), dtype=torch.int64, device=self.device))
        init = make_initial_state(sc, 0, self.device)
        origins = torch.tensor(sc.resolved_origins, dtype=torch.int64, device=self.device)
        k.reset(self.ids, init, origins)
        for lit in self.literals:
            lit.reset(self.ids, init, origins)
        self.ref = init.clone()
        self.wp = [0] * sc.rows
        self.origin = list(sc.resolved_origins)
        if unused and self.invariants_every:
            snap = k.snapshot()
            self.canary = {s: {n: t.clone() for n, t in inv.slot_view(snap, s).items()} for s in unused}
        self.started = True

    # ---- one step -------------------------------------------------------------------------------------------
    def _reset_rows(self, p: StepPlan) -> None:
        if not p.reset_rows:
            return
        ids = [self.ids_list[r] if r in p.reset_rows else PAD_SLOT for r in range(self.sc.rows)]
        tids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        init = make_initial_state(self.sc, generation=p.step + 1, device=self.device)
        orig = [0] * self.sc.rows
        for r, o in zip(p.reset_rows, p.reset_origins):
            orig[r] = o
        torig = torch.tensor(orig, dtype=torch.int64, device=self.device)
        self.kernel.reset(tids, init, torig)
        for lit in self.literals:
            lit.reset(tids, init, torig)
        for r in p.reset_rows:
            self.ref[r] = init[r]
            self.wp[r], self.origin[r] = 0, orig[r]
            for env in self.lit_env.values():
                env[r] = 0.0
        self.coverage["resets"] += len(p.reset_rows)

    def _reference_window(self, inputs: dict[str, torch.Tensor], accepted: list[int]):
        """fp64 outputs [R, T', ...] and the state after each row's accepted prefix; the readout
        magnitudes (:func:`readout_magnitude`, [R, T', ...]) are left in ``self.ref_magnitude``."""
        T = self.sc.window
        st = self.ref
        new = self.ref
        outs, mags = [], []
        kt = torch.tensor(accepted, device=self.device)
        after_first = None
        for t in range(T):
            tok = {n: v[:, t].to(torch.float64) for n, v in inputs.items()}
            y, st = reference_step(self.sc.family, st, tok, self.ref_params)
            outs.append(y)
            mags.append(readout_magnitude(self.sc.family, st, tok, self.ref_params, self.sc.precision.scaled_state))
            if t == 0:
                after_first = st
            sel = (kt == t + 1).view(-1, *([1] * (st.dim() - 1)))
            new = torch.where(sel, st, new)
        self.ref_magnitude = torch.stack(mags, dim=1)
        return torch.stack(outs, dim=1), new, after_first

    def _check_state(self, step: int, check: str, got: torch.Tensor, want: torch.Tensor,
                     lit: list[torch.Tensor] | None, rows: list[int]) -> tuple[float, float | None]:
        """Tolerance rule on states of ``rows`` (non-finite values always fail); returns (max error,
        max error / bound, None without the literal model)."""
        if not rows:
            return 0.0, 0.0
        idx = torch.tensor(rows, device=self.device)
        g, w = got.index_select(0, idx), want.index_select(0, idx)
        m = error_metrics(g, w, self.u_state, lead=1)
        lit_err = None
        if lit:
            errs = [error_metrics(x.index_select(0, idx), w, self.u_state, lead=1)["max_abs"] for x in lit]
            lit_err = torch.stack(errs).amax(0)
        if lit_err is not None and self.sr_envelope:
            lit_err = torch.maximum(lit_err, self.lit_env["state"].index_select(0, idx))
            self.lit_env["state"].index_copy_(0, idx, torch.where(torch.isfinite(lit_err), lit_err, 0.0))
        if lit_err is not None:
            b = bound(self.sc.precision, lit_err, m["ref_max"] * self._sr_walk(idx), state=True)
        else:  # without the literal model only non-finite states fail
            b = torch.full_like(m["max_abs"], float("inf"))
        ratio = m["max_abs"] / b.clamp_min(1e-300)
        nonfinite = ~torch.isfinite(g.reshape(len(rows), -1)).all(-1)
        bad = (ratio > 1) | nonfinite
        if bool(bad.any()):
            for i in torch.nonzero(bad).flatten().tolist():
                r = rows[i]
                if bool(nonfinite[i]):
                    pos = inv.first_index(~torch.isfinite(g[i]))
                    self.fail(step, "non-finite", f"{check}: first non-finite state element at index {pos}",
                              row=r, slot=self.ids_list[r])
                    continue
                e, bb, sc_r = float(m["max_abs"][i]), float(b[i]), float(m["ref_max"][i])
                self.fail(step, check, f"max abs error {e:.3e} > bound {bb:.3e} (= {self.tol.factor} x literal "
                                       f"{float(lit_err[i]):.3e} + {self.tol.floor_u} u x scale {sc_r:.3e}); "
                                       f"{self._precision_hint(e, sc_r, self.u_state)}",
                          row=r, slot=self.ids_list[r], value=e, bound=bb)
        max_err = float(m["max_abs"].max())
        if lit_err is None:
            return max_err, None
        finite_ratio = ratio[torch.isfinite(ratio)]
        return max_err, float(finite_ratio.max()) if finite_ratio.numel() else float("inf")

    def _precision_hint(self, err: float, scale: float, u: float) -> str:
        rel = err / scale if scale > 0 else float("inf")
        if rel >= 0.05:
            return f"relative error {rel:.2e}: a bookkeeping error, not rounding"
        return (f"relative error {rel:.2e} = {rel / u:.1f} u of the declared mode {self.sc.mode}: the kernel runs "
                f"at a lower effective precision than declared")

    def step(self) -> dict:
        """Run the next planned step; returns its record (per-step metrics as floats when
        ``record_metrics``; failures are added to the run).  ``self.last_step`` keeps the step's
        device tensors for callers that accumulate without host syncs (drift): ``plan``,
        ``inputs``, ``out``, ``ref_out``, ``max_abs`` / ``rel_l2`` ``[rows, T']`` (NaN for padding
        rows), ``flush_rows``."""
        if not self.started:
            self.start()
        if self.step_idx >= len(self.plans):
            raise ValueError(f"step: the plan has {len(self.plans)} steps, all run")
        p = self.plans[self.step_idx]
        s, sc, k, dev = p.step, self.sc, self.kernel, self.device
        self._reset_rows(p)
        inputs = make_inputs(sc, s, dev)
        check_inv = bool(self.invariants_every) and s % self.invariants_every == 0
        use_lit = bool(self.literal_every) and s % self.literal_every == 0
        check_state = bool(self.state_every) and s % self.state_every == 0
        flush_rows = [r for r in self.active if self.dec.is_flush(self.wp[r])]
        for r in flush_rows:
            self.lit_env["flushes"][r] += 1
        for r in self.active:
            self.phases.add((self.wp[r], p.accepted[r]))
            self.coverage["flush verifies" if r in flush_rows else "non-flush verifies"] += 1
            if self.dec.speculative and r in flush_rows and self.origin[r] + self.wp[r] >= sc.ring_rows:
                self.coverage["ring wraps"] += 1
        snap0 = k.snapshot() if check_inv else None

        out = inv.poisoned_out(sc.rows, sc.window, k.out_shape, sc.precision.act_dtype, self.pad_rows, dev)
        ret = k.verify(self.ids, inputs, out=out)
        if ret is not out and ret is not None:
            self.fail(s, "out-param", "verify returned a new tensor instead of writing into out=")
            out = ret
        self.tokens_verified += len(self.active) * sc.window
        snap1 = k.snapshot() if check_inv else None
        ckpt_after_verify = k.checkpoint_state(self.ids) if (check_inv or check_state) and flush_rows else None

        lit_outs = [lit.verify(self.ids, inputs) for lit in self.literals] if use_lit else None
        lit_out = lit_outs[0] if lit_outs else None
        lit_ckpt = ([lit.checkpoint_state(self.ids) for lit in self.literals]
                    if use_lit and ckpt_after_verify is not None else None)
        ref_out, ref_new, ref_first = self._reference_window(inputs, p.accepted)

        # -- exact output checks (one host sync): padding rows, poison, non-finite
        act = self.active_idx
        o_act = out.index_select(0, act)
        unwritten = inv.unwritten_mask(o_act)
        nonfinite = ~torch.isfinite(o_act) & ~unwritten
        lit_nonfinite = (~torch.isfinite(lit_out.index_select(0, act)) if lit_out is not None else None)
        pad_bad = ((out.index_select(0, self.pad_idx) != inv.PAD_CANARY).flatten(1).any(-1) if self.pad_rows
                   else torch.zeros(0, dtype=torch.bool, device=dev))
        flags = torch.cat([pad_bad, unwritten.any().view(1), nonfinite.any().view(1)]).tolist()
        for j, r in enumerate(self.pad_rows):
            if flags[j]:
                pos = inv.first_index(out[r] != inv.PAD_CANARY)
                self.fail(s, "padding-output", f"padding row output changed (first at {pos})", row=r,
                          position=pos[0])
        if flags[-2]:
            for i, r in enumerate(self.active):
                if bool(unwritten[i].any()):
                    pos = inv.first_index(unwritten[i])
                    self.fail(s, "unwritten-output", f"output element {pos[1:]} still holds the NaN poison",
                              row=r, slot=self.ids_list[r], position=pos[0])
        if flags[-1]:
            for i, r in enumerate(self.active):
                bad = nonfinite[i]
                if lit_nonfinite is not None:
                    expected = bad & lit_nonfinite[i]
                    if bool(expected.any()):
                        self.coverage["non-finite outputs also in the literal model (mode overflow)"] += int(
                            expected.sum())
                    bad = bad & ~lit_nonfinite[i]
                if bool(bad.any()):
                    pos = inv.first_index(bad)
                    self.fail(s, "non-finite", f"first non-finite output element {pos[1:]} "
                                               f"(value {float(o_act[i][pos]):g}, reference "
                                               f"{float(ref_out[r][pos]):.4g})",
                              row=r, slot=self.ids_list[r], position=pos[0])

        # -- metrics and the tolerance rule on outputs
        ref_a = ref_out.index_select(0, act)
        m = error_metrics(o_act, ref_a, self.u_out, lead=2)
        dev_rec = {"max_abs": m["max_abs"].amax(), "rel_l2": m["rel_l2"].amax(), "rms_ratio": m["rms_ratio"],
                   "in_u": m["in_u"].amax()}
        if lit_out is not None:
            mls = [error_metrics(x.index_select(0, act), ref_a, self.u_out, lead=2) for x in lit_outs]
            ml = mls[0]
            # The literal's envelope over the window (and over its SR replicas).
            lit_row = torch.stack([x["max_abs"] for x in mls]).amax(0).amax(-1, keepdim=True)
            if self.sr_envelope:
                lit_row = torch.maximum(lit_row, self.lit_env["output"].index_select(0, act)[:, None])
                self.lit_env["output"].index_copy_(0, act, torch.where(torch.isfinite(lit_row[:, 0]), lit_row[:, 0],
                                                                       0.0))
            # The floor's scale: the largest output or readout term magnitude of the row's window.
            mag = self.ref_magnitude.index_select(0, act).flatten(2).amax(-1)
            scale = torch.maximum(m["ref_max"], mag).amax(-1, keepdim=True)
            b = bound(sc.precision, lit_row, scale * self._sr_walk(act)[:, None]).expand_as(m["max_abs"])
            excess = (m["max_abs"] > b) & ~(unwritten.flatten(2).any(-1))
            if lit_nonfinite is not None:
                excess &= ~lit_nonfinite.flatten(2).any(-1)
            ratio = m["max_abs"] / b.clamp_min(1e-300)
            dev_rec["literal_max_abs"] = ml["max_abs"].amax()
            dev_rec["bound_ratio"] = torch.where(torch.isfinite(ratio), ratio, torch.zeros_like(ratio)).amax()
            if bool(excess.any()):
                for i, t in torch.nonzero(excess).tolist():
                    r = self.active[i]
                    e, bb, sc_r = float(m["max_abs"][i, t]), float(b[i, t]), float(scale[i, 0])
                    self.fail(s, "output", f"max abs error {e:.3e} > bound {bb:.3e} (= {self.tol.factor} x literal "
                                           f"{float(lit_row[i, 0]):.3e} + {self.tol.floor_u} u x scale {sc_r:.3e}); "
                                           f"{self._precision_hint(e, sc_r, self.u_out)}",
                              row=r, slot=self.ids_list[r], position=t, value=e, bound=bb)

        # -- exact invariants after verify
        if check_inv:
            for r in self.active:
                slot = self.ids_list[r]
                is_flush = r in flush_rows
                if self.replay_kind and not is_flush and inv.checkpoint_changed(snap0, snap1, slot):
                    self.fail(s, "checkpoint-unchanged", f"non-flush verify at write_pos {self.wp[r]} changed "
                                                         f"the checkpoint", row=r, slot=slot)
                if self.replay_kind and snap0.records:
                    rows = inv.committed_rows(self.origin[r], self.wp[r], sc.ring_rows, self.dec.speculative)
                    bad = inv.changed_ring_rows(snap0, snap1, slot, rows)
                    if bad:
                        self.fail(s, "committed-ring-rows", f"verify overwrote committed ring rows {bad} "
                                                            f"(write_pos {self.wp[r]}, origin {self.origin[r]})",
                                  row=r, slot=slot)
            self._check_canaries(s, snap1, "verify")

        # -- flush: checkpoint vs reference at the folded count
        if ckpt_after_verify is not None and self.replay_kind:
            folded = self.ref if self.dec.speculative else ref_first
            self._check_state(s, "flush-checkpoint", ckpt_after_verify, folded, lit_ckpt, flush_rows)

        # -- commit
        acc = torch.tensor([p.accepted[r] for r in range(sc.rows)], dtype=torch.int64, device=dev)
        k.commit(self.ids, acc)
        if use_lit:
            for lit in self.literals:
                lit.commit(self.ids, acc)
        for r in self.active:
            self.wp[r], self.origin[r] = self.dec.commit_cursor(self.wp[r], self.origin[r], r in flush_rows,
                                                                p.accepted[r])
            self.tokens_accepted += p.accepted[r]
        self.ref = ref_new

        if check_inv:
            snap2 = k.snapshot()
            if self.replay_kind:
                for r in self.active:
                    slot = self.ids_list[r]
                    got = (int(snap2.write_pos[slot]), int(snap2.origin[slot]), bool(snap2.is_flush[slot]))
                    want = (self.wp[r], self.origin[r], self.dec.is_flush(self.wp[r]))
                    if got != want:
                        self.fail(s, "cursor", f"after commit({p.accepted[r]}): (write_pos, origin, is_flush) = "
                                               f"{got}, spec rule gives {want}", row=r, slot=slot)
            self._check_canaries(s, snap2, "commit")

        rec = {"step": s}
        if check_state:
            got = k.committed_state(self.ids)
            lit = [x.committed_state(self.ids) for x in self.literals] if use_lit else None
            rec["state_err"], rec["state_bound_ratio"] = self._check_state(s, "state", got, self.ref, lit,
                                                                           self.active)

        if self.digest is not None:
            self.digest.update(out)
        full_max = torch.full((sc.rows, sc.window), float("nan"), dtype=torch.float64, device=dev)
        full_rel = full_max.clone()
        full_max[act], full_rel[act] = m["max_abs"], m["rel_l2"]
        self.last_step = {"plan": p, "inputs": inputs, "out": out, "ref_out": ref_out, "max_abs": full_max,
                          "rel_l2": full_rel, "flush_rows": flush_rows}
        if self.record_metrics:
            names = list(dev_rec)
            rec.update(zip(names, torch.stack([dev_rec[n].to(torch.float64) for n in names]).tolist()))
            for key in self.metrics:
                self.metrics[key].append(rec.get(key))
        self.step_idx += 1
        return rec

    def _check_canaries(self, step: int, snap: KernelSnapshot, when: str) -> None:
        for slot, before in self.canary.items():
            changed = inv.changed_fields(before, inv.slot_view(snap, slot))
            if changed:
                self.fail(step, "unused-slot", f"{when} changed unused slot {slot}: {', '.join(changed)}", slot=slot)

    # ---- checkpoint / resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to resume this run (CPU tensors; torch.save-able)."""
        if not self.started:
            self.start()
        return {
            "scenario": self.sc.to_json(),
            "kernel": self.kernel_name,
            "step_idx": self.step_idx,
            "kernel_snapshot": inv.snapshot_to_dict(self.kernel.snapshot()),
            "literal_snapshot": None if self.literal is None else inv.snapshot_to_dict(self.literal.snapshot()),
            "replica_snapshots": [inv.snapshot_to_dict(x.snapshot()) for x in self.replicas],
            "ref": self.ref.detach().cpu(),
            "wp": list(self.wp), "origin": list(self.origin),
            "canary": {s: {k: v.cpu() for k, v in d.items()} for s, d in self.canary.items()},
            "digest": None if self.digest is None else self.digest.hex,
            "failures": [vars(f) for f in self.failures], "failure_counts": dict(self.failure_counts),
            "metrics": {k: list(v) for k, v in self.metrics.items()},
            "coverage": dict(self.coverage), "phases": sorted(self.phases),
            "tokens": (self.tokens_accepted, self.tokens_verified), "notes": list(self.notes),
            "lit_env": {k: v.detach().cpu() for k, v in self.lit_env.items()},
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
        self.canary = {int(s): dict(v) for s, v in d["canary"].items()}
        if self.digest is not None:
            self.digest = inv.RunDigest(d["digest"] or "")
        self.failures = [Failure(**f) for f in d["failures"]]
        self.failure_counts = Counter(d["failure_counts"])
        self.metrics = {k: list(v) for k, v in d["metrics"].items()}
        self.coverage = Counter(d["coverage"])
        self.phases = {tuple(x) for x in d["phases"]}
        self.tokens_accepted, self.tokens_verified = d["tokens"]
        self.notes = list(d["notes"])
        for k, v in d.get("lit_env", {}).items():
            self.lit_env[k] = v.to(self.device)
        self.started = True

    # ---- result -------------------------------------------------------------------------------------------------
    def result(self, wall_s: float = 0.0, exception: dict | None = None) -> ValidationResult:
        sc = self.sc
        res = ValidationResult(kernel=self.kernel_name, family=sc.family, mode=sc.mode, scenario=sc.to_dict(),
                               literal=self.literal_name, steps_planned=len(self.plans), steps_run=self.step_idx,
                               tokens_accepted=self.tokens_accepted, tokens_verified=self.tokens_verified,
                               wall_s=wall_s, failures=sorted(self.failures, key=lambda f: f.sort_key),
                               failure_counts=dict(self.failure_counts), exception=exception,
                               device=str(self.device))
        res.metrics = {k: v for k, v in self.metrics.items() if any(x is not None for x in v)}
        summ = {}
        for key in ("max_abs", "rel_l2", "rms_ratio", "in_u", "literal_max_abs", "bound_ratio", "state_err",
                    "state_bound_ratio"):
            vals = [x for x in self.metrics.get(key, []) if x is not None]
            if vals:
                summ[f"worst {key}"] = max(vals)
        res.summary = summ
        hi = self.dec.max_write_pos()
        want = {(w, kk) for w in range(hi + 1) for kk in range(1, sc.window + 1)}
        res.coverage = {**dict(self.coverage),
                        "(write_pos, k) pairs": f"{len(self.phases & want)}/{len(want)}"}
        res.checks = ["exact every step: unwritten-output, non-finite, padding-output, out-param"]
        if self.invariants_every:
            res.checks.append(f"exact every {self.invariants_every} step(s): unused-slot"
                              + (", checkpoint-unchanged, committed-ring-rows, cursor" if self.replay_kind else ""))
        if self.literal_every:
            res.checks.append(f"tolerance every {self.literal_every} step(s) vs {self.literal_name}: output"
                              + (", flush-checkpoint" if self.replay_kind else ""))
        if self.state_every:
            res.checks.append(f"state every {self.state_every} step(s)")
        res.notes = list(self.notes)
        if not sc.unused_slots:
            res.notes.append("no unused slots: the canary (unused-slot) check had nothing to watch")
        if not self.pad_rows:
            res.notes.append("no padding rows: padding-row handling was not exercised")
        if self.literal is None:
            res.notes.append("no literal model at this mode: the tolerance rule was not applied to outputs")
        res.passed = not self.failure_counts and exception is None
        return res


def _exception_record(step: int, e: BaseException) -> dict:
    return {"step": step, "type": type(e).__name__, "message": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}


def _repeat_digest(sc: Scenario, kernel, device, plans: list[StepPlan], n: int) -> tuple[str, list[str]]:
    ls = Lockstep(sc, kernel, device=device, literal_every=0, invariants_every=0, state_every=0,
                  record_metrics=False, steps=plans)
    hexes = []
    # Kernel only: the reference is not needed to replay the outputs.
    ls.start()
    for _ in range(n):
        p = ls.plans[ls.step_idx]
        ls._reset_rows(p)
        inputs = make_inputs(sc, p.step, ls.device)
        out = inv.poisoned_out(sc.rows, sc.window, ls.kernel.out_shape, sc.precision.act_dtype, ls.pad_rows,
                               ls.device)
        ret = ls.kernel.verify(ls.ids, inputs, out=out)
        ls.digest.update(out if ret is None else ret)
        ls.kernel.commit(ls.ids, torch.tensor(p.accepted, dtype=torch.int64, device=ls.device))
        hexes.append(ls.digest.hex)
        ls.step_idx += 1
    return inv.snapshot_digest(ls.kernel.snapshot()), hexes


def run_scenario(sc: Scenario, kernel, *, device="cpu", progress: bool = False, repeat_check: bool = True,
                 literal_every: int = 1, invariants_every: int = 1, state_every: int = 1,
                 stop_on_failure: bool = False, max_failures: int = 200) -> ValidationResult:
    """Validate ``kernel`` (registered name, class, or a zero-argument factory of fresh instances is not
    needed: names and classes are rebuilt for the repeat run) on ``sc``; never raises for a kernel
    error: exceptions are recorded in the result with the step they happened at."""
    if not isinstance(sc, Scenario):
        raise ValueError(f"sc: expected a Scenario, got {type(sc).__name__}")
    if isinstance(kernel, KernelUnderTest) and repeat_check:
        raise ValueError("kernel: pass a registered name or a class so the repeat check can build a fresh instance "
                         "(or repeat_check=False)")
    ls = Lockstep(sc, kernel, device=device, literal_every=literal_every, invariants_every=invariants_every,
                  state_every=state_every, max_failures=max_failures)
    n = len(ls.plans)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="step", desc=f"{ls.kernel_name} {sc.family} {sc.mode}", leave=False)
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
        ls.fail(exc["step"], "exception", f"{exc['type']}: {exc['message']}")
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    if repeat_check and exc is None and ls.step_idx:
        try:
            final, hexes = _repeat_digest(sc, type(ls.kernel) if not isinstance(kernel, str) else kernel, device,
                                          ls.plans, ls.step_idx)
            first_bad = next((i for i, (a, b) in enumerate(zip(step_digests, hexes)) if a != b), None)
            if first_bad is not None:
                ls.fail(ls.plans[first_bad].step, "repeat",
                        "a second run on the same inputs gave different output bits")
            elif final != inv.snapshot_digest(ls.kernel.snapshot()):
                ls.fail(ls.plans[ls.step_idx - 1].step, "repeat",
                        "a second run on the same inputs left different stored state bits")
        except Exception as e:  # noqa: BLE001
            ls.fail(0, "repeat", f"the repeat run raised {type(e).__name__}: {e}")
    return ls.result(wall_s=wall, exception=exc)


__all__ = ["Lockstep", "build_kernel", "literal_twin_name", "reference_step", "run_scenario"]
