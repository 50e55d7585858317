"""Long runs of a mixer kernel against the fp64 whole mixer step: the drift of the mixer output and of
the SSM state, and the conv window's exactness at every commit.

Oracle: :meth:`MixerSpec.reference_step` in fp64 (``replayssm/mixer/spec.py``), run token by token on
each row's accepted stream from the same initial state and conv window and the same inputs; the
kernel's SSM state is never re-synchronised with it, so the error is the drift of the whole run.
The committed conv window is read from the kernel's raw storage by its declared design
(``replayssm/ops/conv/policies.py``) and compared bit for bit with the last d_conv - 1 accepted conv
inputs after every commit: it is data movement, so one inexact commit fails the run.

Measured per accepted token: the mixer output's relative RMS error ``||out - ref|| / ||ref||``; per
commit: the committed SSM state's (state units, fp64).  Both are binned over the token axis
(:data:`BINS` equal bins, each bin's peak) and judged by the SSM drift job's gross bound
(``validators/jobs/drift/verdict.py``: ``min(2^12 u, max(1/2, 2^7 u))``, no correct kernel reaches
it).  A run fails on an inexact conv window, a non-finite error or a peak above the gross bound.
Expected: the literal mixers keep the conv exact and their errors at the level of the mode's
rounding (the SSM drift job's literal models: at most 2^7 u).

The schedule: ``rows`` sequences, one slot each, every step verifies T' tokens per row and accepts
``k`` drawn uniformly in 1..T' (T' = 1: standard decode), until every row has ``tokens`` accepted.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from replayssm.mixer.kernel import MixerConfig, MixerKernel, mixer_kernel
from replayssm.mixer.spec import mixer_preset
from replayssm.ops.conv.policies import conv_policy
from replayssm.precision import parse_mode
from replayssm.validators.engine.mixer import checks
from replayssm.validators.engine.mixer.runner import MixerPlan, make_inputs, make_params
from replayssm.validators.engine.mixer.scenario import mixer_reason
from replayssm.validators.jobs.drift.verdict import RULE, gross_bound

BINS = 32


@dataclass(frozen=True)
class MixerDriftConfig:
    family: str = "mamba2"
    mode: str = "s32a16"
    tokens: int = 2048
    rows: int = 1
    window: int = 4
    buffer: int | None = None
    seed: int = 0
    geometry: str = "tiny"
    d_conv: int = 4

    def __post_init__(self) -> None:
        for name in ("tokens", "rows", "window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        parse_mode(self.mode)
        self.plan(1)

    def plan(self, steps: int) -> MixerPlan:
        """The decode configuration (the steps themselves are drawn as the run goes)."""
        B = self.buffer if self.buffer is not None else (max(8, self.window) if self.window > 1 else 8)
        return MixerPlan(self.rows, self.window, B, tuple((tuple(range(self.rows)), (1,) * self.rows)
                                                          for _ in range(steps)))


class _Curve:
    """Peak of a per-token quantity in :data:`BINS` equal bins of the token axis."""

    def __init__(self, tokens: int) -> None:
        self.tokens, self.peaks, self.last, self.nonfinite = tokens, [None] * BINS, None, 0

    def add(self, token: int, value: float) -> None:
        if not math.isfinite(value):
            self.nonfinite += 1
            value = math.inf
        b = min(BINS - 1, token * BINS // self.tokens)
        self.peaks[b] = value if self.peaks[b] is None else max(self.peaks[b], value)
        self.last = value

    def to_dict(self) -> dict:
        seen = [p for p in self.peaks if p is not None]
        return {"peak": max(seen) if seen else None, "final": self.last, "nonfinite": self.nonfinite,
                "bin_tokens": math.ceil(self.tokens / BINS), "bins": self.peaks}


def _rel(got: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """Per row (dim 0): ``||got - ref|| / ||ref||`` (0 when both are 0, inf when only ref is)."""
    d = (got.double() - ref).flatten(1).norm(dim=1)
    den = ref.flatten(1).norm(dim=1)
    rel = torch.where(den > 0, d / den.clamp_min(1e-300), torch.where(d == 0, 0.0, math.inf))
    return rel.tolist()


def drift_mixer(kernel: type[MixerKernel] | str, cfg: MixerDriftConfig, device="cpu", progress=None) -> dict:
    """Run ``kernel`` for ``cfg.tokens`` accepted tokens per row; the report (a JSON-ready dict)."""
    cls = mixer_kernel(kernel) if isinstance(kernel, str) else kernel
    g = mixer_preset(cfg.geometry, cfg.family, cfg.d_conv)
    mode = parse_mode(cfg.mode)
    plan = cfg.plan(1)
    reason = mixer_reason(cls, g, mode, plan)
    if reason:
        raise ValueError(f"--kernel: {cls.name} does not support this run: {reason}")
    policy = conv_policy(cls.conv_policy)
    params = make_params(g, mode, cfg.seed)
    kern = cls(MixerConfig(g, params, mode, plan.decode, cfg.rows, torch.device(device)))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    R, T, W, C, act = cfg.rows, cfg.window, g.d_conv - 1, g.conv_channels, mode.act_dtype
    window = torch.randn((R, C, W), generator=gen, dtype=torch.float64).to(act)
    state = torch.randn((R, *g.state_shape), generator=gen, dtype=torch.float64) * 0.1
    if mode.state_dtype != torch.float64:
        state = state.to(mode.state_dtype).double()
    slots = torch.arange(R, dtype=torch.int64, device=device)
    kern.reset(slots, state.to(device, mode.compute_dtype), window.to(device))
    state, window = state.to(device), window.to(device)
    p64 = {n: v.double().to(device) for n, v in params.items()}
    out_curve, state_curve = _Curve(cfg.tokens), _Curve(cfg.tokens)
    conv = {"commits": 0, "inexact": 0, "first_inexact": None}
    done = [0] * R
    steps, t0 = 0, time.perf_counter()
    while min(done) < cfg.tokens:
        inputs = {n: t.to(device) for n, t in make_inputs(g, mode, R, T, gen).items()}
        ks = [min(1 + int(torch.randint(T, (1,), generator=gen)), max(1, cfg.tokens - done[r])) for r in range(R)]
        out = kern.verify(slots, inputs)
        st, win, new_state = state, window.double(), state.clone()
        for t in range(max(ks)):  # every row at once; a row's tokens past its k are not judged
            y, st, win = g.spec.reference_step(st, win, {n: v[:, t].double() for n, v in inputs.items()}, p64, g.ssm)
            rel = _rel(out[:, t], y)
            for r in range(R):
                if t < ks[r]:
                    out_curve.add(done[r] + t, rel[r])
                if t == ks[r] - 1:
                    new_state[r] = st[r]
        state = new_state
        for r in range(R):
            window[r] = torch.cat([window[r], inputs["conv_x"][r, :ks[r]].transpose(0, 1)], dim=-1)[:, -W:]
        kern.commit(slots, torch.tensor(ks, dtype=torch.int64, device=device))
        srel = _rel(kern.committed_state(slots), state)
        storage = kern.conv_storage()
        for r in range(R):
            done[r] += ks[r]
            state_curve.add(done[r] - 1, srel[r])
            win, msg = checks.read_committed(policy, storage, r, g.d_conv, C, T)
            msg = msg or checks.conv_state_failure(win, window[r])
            conv["commits"] += 1
            if msg:
                conv["inexact"] += 1
                if conv["first_inexact"] is None:
                    conv["first_inexact"] = {"step": steps, "row": r, "token": done[r], "message": msg}
        steps += 1
        if progress is not None:
            progress(min(done), cfg.tokens)
    bound = gross_bound(mode)
    res = {"level": "mixer", "kernel": cls.name, "conv_policy": cls.conv_policy, **asdict(cfg),
           "buffer": plan.buffer, "steps": steps, "tokens_run": sum(done), "conv": conv,
           "output": out_curve.to_dict(), "state": state_curve.to_dict(), "gross_bound": bound, "gross_rule": RULE,
           "wall_s": round(time.perf_counter() - t0, 3)}
    res["failures"] = failures = []
    if conv["inexact"]:
        f = conv["first_inexact"]
        failures.append(f"conv-state: {conv['inexact']} of {conv['commits']} commits inexact, the first at step "
                        f"{f['step']} row {f['row']} (token {f['token']}): {f['message']}")
    for what, c in (("mixer-output", out_curve), ("ssm-state", state_curve)):
        d = c.to_dict()
        if c.nonfinite:
            failures.append(f"{what}: {c.nonfinite} non-finite relative error(s)")
        elif d["peak"] is not None and d["peak"] > bound:
            failures.append(f"{what}: peak relative error {d['peak']:.3e} above the gross bound {bound:.3e} ({RULE})")
    res["passed"] = not failures
    return res


def verdict_line(res: dict) -> str:
    head = (f"{res['kernel']} [{res['family']} mixer, {res['mode']}, conv {res['conv_policy']}, "
            f"{res['rows']} row(s) x {res['tokens']} tokens, T'={res['window']}]")
    if res["passed"]:
        return (f"PASS {head}: conv exact over {res['conv']['commits']} commits; peak relative error output "
                f"{res['output']['peak']:.3e}, state {res['state']['peak']:.3e} (gross bound {res['gross_bound']:.3g})")
    return f"FAIL {head}: " + "; ".join(res["failures"])


def drift_record(recorder, res: dict) -> dict:
    """One record of a mixer drift run (``replayssm drift --level mixer --record FILE``)."""
    m = {"tokens": res["tokens"], "tokens_run": res["tokens_run"], "rows": res["rows"], "steps": res["steps"],
         "conv_commits": res["conv"]["commits"], "conv_inexact": res["conv"]["inexact"],
         "output_peak": res["output"]["peak"], "output_final": res["output"]["final"],
         "state_peak": res["state"]["peak"], "state_final": res["state"]["final"],
         "gross_bound": res["gross_bound"], "wall_s": res["wall_s"]}
    cfg = {k: res[k] for k in ("family", "mode", "tokens", "rows", "window", "buffer", "seed", "geometry", "d_conv",
                               "conv_policy")}
    return recorder.record(
        f"{res['family']}/{res['kernel']}/{res['mode']}/{res['geometry']}/mixer-drift/T{res['window']}",
        metrics=m, verdict="pass" if res["passed"] else "fail", reason="; ".join(res["failures"]) or None,
        config={"level": "mixer", **cfg}, family=res["family"], kernel=res["kernel"], mode=res["mode"],
        geometry=res["geometry"])
