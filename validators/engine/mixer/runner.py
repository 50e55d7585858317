"""Drive a mixer kernel through speculative (or standard) decode steps beside the fp64 whole-step
reference and the literal mixer at the same mode, and judge every step by ``checks.py``.

Oracle: the fp64 mixer step of each family (``replayssm/ops/<family>/mixer_naive.py``, the family's
naive recurrence reused), run token by token on the accepted stream from the same inputs (sampled
in the activation dtype, upcast exactly) and the same parameters (conv and norm weights rounded to
the activation dtype, as models ship them).  Expected error: the literal mixer's, within the
tolerance rule; the conv window exact.

The default schedule (:func:`default_plan`) is built so that every field bug of the conv state shows
in it: 4 slots, one never named (``unnamed-slots``), a padding row in every step, the rows' slots
permuted between steps, the accepted count k cycling through 1..T' per slot (T' = d_conv + 1 by
default, so k > d_conv - 1 happens: a count clamped to d_conv - 1 shows), enough tokens to cross
several blocks of 8 (a block-boundary read shows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import replayssm.adapters.causal_conv1d  # noqa: F401  (registers the conv adapters: their code loads on first use)
import replayssm.adapters.fla_conv  # noqa: F401
import replayssm.adapters.sglang_conv  # noqa: F401
import replayssm.adapters.vllm_conv  # noqa: F401
from replayssm.families import family
from replayssm.interface import PAD_SLOT, DecodeConfig
from replayssm.mixer.kernel import ComposedMixer, MixerConfig, MixerKernel, mixer_kernel
from replayssm.mixer.spec import MixerGeometry
from replayssm.ops.conv.policies import conv_policy
from replayssm.precision import parse_mode
from replayssm.scenarios.inputs import DISTRIBUTIONS
from replayssm.validators.engine.invariants import _slot_fields
from replayssm.validators.engine.mixer import (
    checks,
    mutants,  # noqa: F401  (registers the broken mixers)
)
from replayssm.validators.engine.mixer.envelope import MixerEnvelope

LITERAL = "mixer-literal-compact-at-commit"
# The literal mixer in both legitimate conv orders: a correct kernel may sum the taps in any order
# (FLA 0.6.0 sums pairwise: 1.01-1.16x a one-order bound at gdn/kda s32a32, rec:10f2e0a4dfde64bb).
LITERALS = (LITERAL, "mixer-literal-reversed-order")


@dataclass(frozen=True)
class MixerPlan:
    """A step plan: ``steps`` of (slot ids per row, accepted count per row); ``resets[i]``: the slots
    re-admitted (a fresh initial SSM state and conv window: a new sequence in a reused slot) before step i."""

    num_slots: int
    window: int
    buffer: int
    steps: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    resets: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.num_slots, int) or self.num_slots < 1:
            raise ValueError(f"num_slots: expected a positive integer, got {self.num_slots!r}")
        _ = self.decode  # window and buffer checked by DecodeConfig
        if len(self.resets) > len(self.steps):
            raise ValueError(f"resets: {len(self.resets)} entries for {len(self.steps)} steps")
        for i, (ids, ks) in enumerate(self.steps):
            act = [s for s in ids if s != PAD_SLOT]
            if len(ids) != len(ks) or not act or len(set(act)) != len(act) \
                    or any(not 0 <= s < self.num_slots for s in act):
                raise ValueError(f"steps[{i}]: expected distinct slots in [0, {self.num_slots}) or {PAD_SLOT} (at "
                                 f"least one active) and one count per row, got {ids}, {ks}")
            if any(s != PAD_SLOT and not 1 <= k <= self.window for s, k in zip(ids, ks)):
                raise ValueError(f"steps[{i}]: expected accepted counts in [1, {self.window}], got {ks}")
        for i, rs in enumerate(self.resets):
            if len(set(rs)) != len(rs) or any(not 0 <= s < self.num_slots for s in rs):
                raise ValueError(f"resets[{i}]: expected distinct slots in [0, {self.num_slots}), got {rs}")

    def resets_before(self, step: int) -> tuple[int, ...]:
        return self.resets[step] if step < len(self.resets) else ()

    def to_dict(self) -> dict:
        return {"num_slots": self.num_slots, "window": self.window, "buffer": self.buffer,
                "steps": [[list(ids), list(ks)] for ids, ks in self.steps],
                "resets": [list(r) for r in self.resets]}

    @classmethod
    def from_dict(cls, d: dict) -> MixerPlan:
        try:
            return cls(int(d["num_slots"]), int(d["window"]), int(d["buffer"]),
                       tuple((tuple(int(s) for s in ids), tuple(int(k) for k in ks)) for ids, ks in d["steps"]),
                       tuple(tuple(int(s) for s in r) for r in d.get("resets", ())))
        except (KeyError, TypeError) as e:
            raise ValueError(f"plan: expected num_slots, window, buffer, steps [[ids, ks], ...] and resets, "
                             f"got {type(e).__name__}: {e}") from None

    @property
    def decode(self) -> DecodeConfig:
        if self.window == 1:
            return DecodeConfig("standard", 1, self.buffer)
        return DecodeConfig("speculative", self.window, self.buffer)


def default_plan(d_conv: int = 4, steps: int = 24, window: int | None = None, buffer: int | None = None
                 ) -> MixerPlan:
    """4 slots (slot 1 never named), 3 rows one of which pads, k = 1 + (step + slot) mod T'."""
    T = d_conv + 1 if window is None else window
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"--window: expected an integer T' >= 1, got {T!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--steps: expected a positive integer, got {steps!r}")
    B = (max(8, T) if T > 1 else 4) if buffer is None else buffer
    orders = ((0, PAD_SLOT, 2, 3), (3, 0, PAD_SLOT, 2), (2, 3, 0, PAD_SLOT))
    plan = []
    for i in range(steps):
        ids = orders[i % len(orders)]
        ks = tuple(0 if s == PAD_SLOT else 1 + (i + s) % T for s in ids)
        plan.append((ids, ks))
    return MixerPlan(4, T, B, tuple(plan))


def make_params(g: MixerGeometry, mode, seed: int) -> dict[str, torch.Tensor]:
    """SSM parameters by the family's laws (the ``mild`` distribution); conv weight U(-1, 1)/sqrt(d_conv),
    conv bias U(-0.5, 0.5), norm weight U(0.5, 1.5), each rounded to the activation dtype (fp32 holders)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = g.param_shapes()

    def uniform(name):
        return torch.rand(shapes[name], generator=gen, dtype=torch.float64).float()

    p = {k: v.float() for k, v in family(g.family).make_params(uniform, DISTRIBUTIONS["mild"]).items()}
    act = parse_mode(mode).act_dtype
    p["conv_weight"] = ((uniform("conv_weight") * 2 - 1) / g.d_conv**0.5).to(act).float()
    if "conv_bias" in shapes:
        p["conv_bias"] = (uniform("conv_bias") - 0.5).to(act).float()
    p["norm_weight"] = (uniform("norm_weight") + 0.5).to(act).float()
    return p


def make_inputs(g: MixerGeometry, mode, rows: int, window: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One step's inputs in the activation dtype: N(0, 1) for the conv inputs, z and the gates (the family's
    gate law is N(0, 1) times the mild distribution's dt_scale, 1)."""
    act = parse_mode(mode).act_dtype
    return {n: torch.randn((rows, window, *shp), generator=gen, dtype=torch.float64).to(act)
            for n, shp in g.input_shapes().items()}


@dataclass
class Failure:
    step: int
    row: int
    slot: int
    check: str
    message: str

    def describe(self) -> str:
        return f"step {self.step}, row {self.row}, slot {self.slot}: [{self.check}] {self.message}"


@dataclass
class MixerResult:
    kernel: str
    family: str
    mode: str
    conv_policy: str
    steps_run: int = 0
    failures: list[Failure] = field(default_factory=list)
    worst: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def first_failure(self) -> Failure | None:
        return self.failures[0] if self.failures else None

    def verdict(self) -> str:
        head = f"{self.kernel} [{self.family} mixer, {self.mode}, conv {self.conv_policy}]"
        if self.passed:
            ratios = ", ".join(f"{k} {v:.2f}" for k, v in sorted(self.worst.items()))
            return f"PASS {head}: {self.steps_run} steps; worst error/bound: {ratios}"
        counts: dict[str, int] = {}
        for f in self.failures:
            counts[f.check] = counts.get(f.check, 0) + 1
        return (f"FAIL {head}: first failure at {self.first_failure.describe()} "
                f"({', '.join(f'{c} {n}' for c, n in sorted(counts.items()))})")

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "family": self.family, "mode": self.mode, "conv_policy": self.conv_policy,
                "level": "mixer", "passed": self.passed, "steps_run": self.steps_run, "worst": self.worst,
                "failures": [vars(f) for f in self.failures[:50]]}


def _fields(kernel: MixerKernel) -> dict[str, torch.Tensor]:
    out = {f"conv.{k}": v for k, v in kernel.conv_storage().items()}
    out.update({f"ssm.{k}": v for k, v in _slot_fields(kernel.ssm_snapshot()).items()})
    return out


def validate_mixer(kernel_cls: type[MixerKernel] | str, geometry: MixerGeometry, mode="s32a16",
                   plan: MixerPlan | None = None, seed: int = 0, device="cpu",
                   max_failures: int = 20, arith_envelope: bool = True) -> MixerResult:
    """Run ``kernel_cls`` (a class or a registered mixer kernel name) through ``plan`` and judge each step.
    ``arith_envelope``: the mixer-output and ssm-state bounds take the fp64 arithmetic envelope
    (``envelope.py``) where it is larger than the literal rule, as the SSM level does; False: the
    literal rule alone (what shows the envelope is needed, tests/engine/test_mixer_envelope.py)."""
    if isinstance(kernel_cls, str):
        kernel_cls = mixer_kernel(kernel_cls)
    mode = parse_mode(mode)
    plan = default_plan(geometry.d_conv) if plan is None else plan
    reason = kernel_cls.unsupported_reason(geometry, mode)
    if reason:
        raise ValueError(f"--kernel: {kernel_cls.name} does not support this run: {reason}")
    policy = conv_policy(kernel_cls.conv_policy)
    params = make_params(geometry, mode, seed)
    cfg = MixerConfig(geometry, params, mode, plan.decode, plan.num_slots, torch.device(device))
    kern = kernel_cls(cfg)
    lits = [mixer_kernel(n)(MixerConfig(geometry, params, mode, plan.decode, plan.num_slots, torch.device(device)))
            for n in LITERALS]
    res = MixerResult(kernel_cls.name, geometry.family, mode.id, kernel_cls.conv_policy)
    spec, S, W, C = geometry.spec, plan.num_slots, geometry.d_conv - 1, geometry.conv_channels
    act = mode.act_dtype
    gen = torch.Generator().manual_seed(seed + 1)
    all_slots = torch.arange(S, dtype=torch.int64)
    init_conv = torch.randn((S, C, W), generator=gen, dtype=torch.float64).to(act)
    init_state = torch.randn((S, *geometry.state_shape), generator=gen, dtype=torch.float64) * 0.1
    if mode.state_dtype != torch.float64:
        init_state = init_state.to(mode.state_dtype).double()
    ref_state = init_state.clone()
    ref_window = init_conv.clone()  # [S, C, W] activation dtype: the last W accepted conv inputs
    env = MixerEnvelope.build(kern, geometry, mode, plan.decode, S, "cpu") if arith_envelope else None  # fp64, host

    def admit(slots, state, conv):
        for k in (kern, *lits):
            k.reset(slots.to(device), state.to(device, mode.compute_dtype), conv.to(device))
        ref_state[slots], ref_window[slots] = state, conv
        if env is not None:
            env.admit(slots.tolist(), ref_state)

    admit(all_slots, init_state, init_conv)
    p64 = {n: v.double() for n, v in params.items()}

    def fail(step, row, slot, check, msg):
        res.failures.append(Failure(step, row, slot, check, msg))

    def ratio(name, r):
        res.worst[name] = max(res.worst.get(name, 0.0), r)

    for i, (ids, ks) in enumerate(plan.steps):
        if plan.resets_before(i):  # a new sequence in each of these slots
            again = torch.tensor(plan.resets_before(i), dtype=torch.int64)
            conv = torch.randn((len(again), C, W), generator=gen, dtype=torch.float64).to(act)
            state = torch.randn((len(again), *geometry.state_shape), generator=gen, dtype=torch.float64) * 0.1
            admit(again, state.to(mode.state_dtype).double() if mode.state_dtype != torch.float64 else state, conv)
        R, T = len(ids), plan.window
        slot_ids = torch.tensor(ids, dtype=torch.int64, device=device)
        rows = [(r, s) for r, s in enumerate(ids) if s != PAD_SLOT]
        unnamed = [s for s in range(S) if s not in ids]
        inputs = {n: t.to(device) for n, t in make_inputs(geometry, mode, R, T, gen).items()}
        before = _fields(kern)
        out = torch.full((R, T, *geometry.out_shape), float("nan"), dtype=act, device=device)
        kern.verify(slot_ids, inputs, out=out)
        out_lits = [lit.verify(slot_ids, inputs) for lit in lits]
        msg = checks.padding_failure(out, [r for r, s in enumerate(ids) if s == PAD_SLOT], [r for r, _ in rows])
        if msg:
            fail(i, -1, -1, "padding", msg)
        accepted, refs, states, ssm_toks, ys = {}, {}, {}, {}, {}
        for r, s in rows:
            st, win, refs[r], states[r], ssm_toks[r], ys[r] = ref_state[s], ref_window[s].double(), [], [], [], []
            for t in range(T):
                tok = {n: v[r, t].double().cpu() for n, v in inputs.items()}  # the fp64 reference: host
                o, st, win, ssm_tok, y = spec.reference_parts(st, win, tok, p64, geometry.ssm)
                refs[r].append(o)
                states[r].append(st)
                ssm_toks[r].append(ssm_tok)
                ys[r].append(y)
        arith = None
        if env is not None:  # the SSM part's arithmetic bound over the window, the active rows stacked
            toks = [{n: torch.stack([ssm_toks[r][t][n] for r, _ in rows]).cpu() for n in ssm_toks[rows[0][0]][t]}
                    for t in range(T)]
            arith = env.window([s for _, s in rows], toks, [ks[r] for r, _ in rows], p64)
        for j, (r, s) in enumerate(rows):
            ref = torch.stack(refs[r])
            out_arith = None
            if arith is not None:
                out_arith = env.output_bound(torch.stack(ys[r]).cpu(), inputs["z"][r].double().cpu(),
                                             p64["norm_weight"], arith["output_arith"][j].cpu())
            msg, rt = checks.tolerance_failure("mixer-output", mode, out[r], tuple(o[r] for o in out_lits), ref,
                                               state=False, arith=out_arith)
            ratio("mixer-output", rt)
            if msg:
                fail(i, r, s, "mixer-output", msg)
            k = ks[r]
            accepted[s] = (states[r][k - 1], inputs["conv_x"][r, :k].cpu())
        acc = torch.tensor(ks, dtype=torch.int64, device=device)
        kern.commit(slot_ids, acc)
        for lit in lits:
            lit.commit(slot_ids, acc)
        storage = kern.conv_storage()
        active = [s for _, s in rows]
        got_states = kern.committed_state(torch.tensor(active, dtype=torch.int64, device=device))
        lit_states = [lit.committed_state(torch.tensor(active, dtype=torch.int64, device=device)) for lit in lits]
        for j, (r, s) in enumerate(rows):
            new_state, xs = accepted[s]
            ref_state[s] = new_state
            ref_window[s] = torch.cat([ref_window[s], xs.transpose(0, 1).to(act)], dim=-1)[:, -W:]
            window, msg = checks.read_committed(policy, storage, s, geometry.d_conv, C, plan.window)
            msg = msg or checks.conv_state_failure(window, ref_window[s])
            if msg:
                fail(i, r, s, "conv-state", msg)
            msg, rt = checks.tolerance_failure("ssm-state", mode, got_states[j], tuple(ls[j] for ls in lit_states),
                                               new_state, state=True,
                                               arith=None if arith is None else arith["state_arith"][j:j + 1].cpu())
            ratio("ssm-state", rt)
            if msg:
                fail(i, r, s, "ssm-state", msg)
        msg = checks.unnamed_failure(before, _fields(kern), unnamed)
        if msg:
            fail(i, -1, -1, "unnamed-slots", msg)
        res.steps_run = i + 1
        if len(res.failures) >= max_failures:
            break
    return res


__all__ = ["ComposedMixer", "MixerPlan", "MixerResult", "default_plan", "make_inputs", "make_params",
           "validate_mixer"]
