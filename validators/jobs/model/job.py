"""The ``replayssm model`` job: build the model, run the teacher once, the student per precision mode
and schedule, judge each run against its model-level budget (``[model.<family>."<mode>"]`` of
``golden/tolerances.toml``).

Oracle: ``forcing.py`` (the fp64-recurrence teacher).  A run that does not exercise ReplaySSM (its
plan has no flush or no rejected token) is refused before anything runs (ValueError naming
``--tokens``), as is any bad argument (ValueError naming it, nothing built).

Budget fields per (family, mode): ``k3_kl``, ``p95_abs_dlogprob``, ``max_abs_dlogprob`` (upper
bounds) and ``top1_agreement`` (a lower bound), ``tokens`` (the stream length they were derived at)
and ``provenance`` (derived / hardware / date / commit, as the drift budgets').
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import get
from replayssm.validators.jobs.drift.budgets import DEFAULT_PATH, MODEL_TABLE, PROVENANCE_FIELDS
from replayssm.validators.jobs.model import forcing, hf

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

UPPER = ("k3_kl", "p95_abs_dlogprob", "max_abs_dlogprob")
LOWER = ("top1_agreement",)
BUDGET_FIELDS = (*UPPER, *LOWER, "tokens", "provenance")


@dataclass
class ModelJob:
    """Every setting of one ``replayssm model`` run (checked by :meth:`check`)."""

    arch: str = "qwen3_next"
    family: str | None = None
    size: str = "tiny"
    weights: str | None = None
    kernel: str = "literal-replay"
    modes: tuple = ("s32a32",)
    schedules: tuple = tuple(forcing.SCHEDULES)
    tokens: int = 64
    window: int = 4
    buffer: int = 8
    seed: int = 0
    entropy_fraction: float = 0.5
    device: str = "cpu"
    mutant: str | None = None
    budgets: str | None = None
    options: dict = field(default_factory=dict)

    def check(self) -> None:
        for name in ("tokens", "window", "buffer"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name}: expected a positive integer, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"--seed: expected an integer >= 0, got {self.seed!r}")
        if not self.modes:
            raise ValueError("--precision: expected at least one precision mode")
        for m in self.modes:
            parse_mode(m)
        if not self.schedules:
            raise ValueError("--schedules: expected at least one schedule")
        bad = [s for s in self.schedules if s not in forcing.SCHEDULES]
        if bad:
            raise ValueError(f"--schedules: unknown {bad}; expected names from {list(forcing.SCHEDULES)}")
        if self.mutant is not None and self.mutant not in forcing.MUTANTS:
            raise ValueError(f"--mutant: expected one of {sorted(forcing.MUTANTS)}, got {self.mutant!r}")
        if self.family is not None and self.family not in hf.FAMILY_ARCH:
            raise ValueError(f"--family: expected one of {sorted(hf.FAMILY_ARCH)}, got {self.family!r}")
        if self.weights is None:
            a = hf.architecture(self.arch)
            a.config(self.size, self.seed)
            if self.family is not None and a.family != self.family:
                raise ValueError(f"--family: {self.family} does not match --arch {self.arch} (a {a.family} model)")
        if not 0 < self.entropy_fraction < 1:
            raise ValueError(f"--entropy-fraction: expected a number in (0, 1), got {self.entropy_fraction!r}")
        self.decode()

    def decode(self) -> DecodeConfig:
        try:
            return DecodeConfig("speculative", self.window, self.buffer)
        except ValueError as e:
            raise ValueError(f"--window/--buffer: {e}") from None


def plan_engagement(job: ModelJob) -> dict:
    """The engagement counters each schedule's plan will produce (the cursor rule alone, no model)."""
    dec = job.decode()
    out = {}
    for s in job.schedules:
        rng = np.random.default_rng(job.seed)
        eng = forcing.Engagement()
        wp, origin, n = 0, 0, 0
        while n < job.tokens:
            k = forcing.schedule_k(s, rng, dec.window, n, job.tokens)
            flush = dec.is_flush(wp)
            eng.verifies += 1
            eng.flushes += int(flush)
            eng.rollbacks += int(k < dec.window)
            eng.rejected_tokens += dec.window - k
            wp, new_origin = dec.commit_cursor(wp, origin, flush, k)
            eng.wraps += int(new_origin < origin)
            origin = new_origin
            n += k
        out[s] = eng.as_dict()
    return out


def check_engagement(job: ModelJob) -> dict:
    """Refuse a plan without a flush or without a rejected token (it would not exercise ReplaySSM)."""
    plan = plan_engagement(job)
    flushes = sum(e["flushes"] for e in plan.values())
    rejected = sum(e["rejected_tokens"] for e in plan.values())
    if flushes == 0 or rejected == 0:
        what = "no flush" if flushes == 0 else "no rejected token"
        raise ValueError(f"--tokens: the plan has {what} ({plan}); it would not exercise ReplaySSM: raise --tokens, "
                         f"lower --buffer or add a schedule that rejects (always-1, random)")
    return plan


def load_model_budgets(path: str | Path | None = None) -> dict:
    """``{(family, mode): budget}`` from the ``[model]`` table (ValueError naming the entry when malformed)."""
    p = Path(path) if path is not None else DEFAULT_PATH
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"--budgets: cannot read {p}: {e}") from None
    out = {}
    for fam, modes in data.get(MODEL_TABLE, {}).items():
        for mode, e in modes.items():
            where = f"{p}: [{MODEL_TABLE}.{fam}.\"{mode}\"]"
            if not isinstance(e, dict) or set(e) != set(BUDGET_FIELDS):
                raise ValueError(f"{where}: expected exactly the fields {list(BUDGET_FIELDS)}")
            for f in (*UPPER, *LOWER):
                v = e[f]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                    raise ValueError(f"{where}: {f}: expected a number >= 0, got {v!r}")
            if not all(isinstance(e["provenance"].get(f), str) for f in PROVENANCE_FIELDS):
                raise ValueError(f"{where}: provenance: expected strings {list(PROVENANCE_FIELDS)}")
            out[(fam, parse_mode(mode).id)] = e
    return out


def judge(metrics: dict, budget: dict | None) -> tuple[str, list[str]]:
    if budget is None:
        return "unbudgeted", []
    fails = []
    for f in UPPER:
        v = metrics[f]
        if not math.isfinite(v) or v > budget[f]:
            fails.append(f"{f} {v:.3g} > budget {budget[f]:.3g}")
    for f in LOWER:
        if not metrics[f] >= budget[f]:
            fails.append(f"{f} {metrics[f]:.3g} < budget {budget[f]:.3g}")
    return ("fail" if fails else "pass"), fails


def build_model(job: ModelJob):
    """The model (fp64 when its forward runs in fp64, else fp32) with its mixers installed, its
    architecture, the mixers and the teacher dtype."""
    problem = None
    for dtype in (torch.float64, torch.float32):
        if job.weights is not None:
            model, arch = hf.load_local(job.weights, dtype)
        else:
            model, arch = hf.build_random(job.arch, job.size, job.seed, dtype)
        mixers = forcing.mixers_of(model, arch)
        if not mixers:
            raise ValueError(f"--weights: the model has no {arch.layer_class} layer")
        try:
            forcing.teacher_logits(model, mixers, torch.zeros(2, dtype=torch.int64))
        except RuntimeError as e:
            problem = " ".join(str(e).split())[:200]
            continue
        return model, arch, mixers, dtype
    raise ValueError(f"--{'weights' if job.weights else 'arch'}: the model runs neither in fp64 nor in fp32 "
                     f"({problem})")


def run(job: ModelJob, progress=None) -> dict:
    """The whole job; returns the report dict (see report.py).  ``progress(run, head)`` is called as each
    (mode, schedule) run completes, with the report's fields other than ``runs`` (``head``)."""
    job.check()
    hf.require()
    plan = check_engagement(job)
    if job.weights is None:
        get(job.kernel, hf.architecture(job.arch).family)
    budgets = load_model_budgets(job.budgets)
    t0 = time.perf_counter()
    model, arch, mixers, dtype = build_model(job)
    model.to(job.device)
    if job.family is not None and arch.family != job.family:
        raise ValueError(f"--family: {job.family} does not match the checkpoint's {arch.name} (a {arch.family} model)")
    get(job.kernel, arch.family)
    g = torch.Generator().manual_seed(job.seed)
    ids = torch.randint(0, model.config.vocab_size, (job.tokens + job.window,), generator=g)
    teacher, hidden = forcing.teacher_logits(model, mixers, ids)
    scale = None
    if job.weights is None:
        scale, _ = hf.calibrate_head(model, hidden, job.entropy_fraction)
        teacher, _ = forcing.teacher_logits(model, mixers, ids)
    entropy = hf.mean_entropy(teacher[:job.tokens])
    del hidden
    if torch.device(job.device).type == "cuda":
        torch.cuda.empty_cache()  # the teacher's prefill held the stream's attention scores: give them back
    layers = model.config.layer_types
    head = {"job": "model", "arch": arch.name, "family": arch.family, "kernel": job.kernel, "mutant": job.mutant,
            "source": job.weights or f"random {arch.name} ({job.size}, seed {job.seed})",
            "teacher_dtype": str(dtype).removeprefix("torch."), "layers": list(layers),
            "mixers": len(mixers), "geometry": mixers[0].geometry.to_dict(), "tokens": job.tokens,
            "window": job.window, "buffer": job.buffer, "seed": job.seed, "stream": "uniform random token ids (seeded)",
            "head_scale": scale, "entropy": entropy, "entropy_max": math.log(model.config.vocab_size),
            "plan": plan}
    runs = []
    for mode in job.modes:
        for sched in job.schedules:
            r = forcing.run_student(model, mixers, ids, teacher, job.tokens, job.kernel, mode, job.decode(), sched,
                                    job.seed, job.device, job.mutant, job.options)
            verdict, why = judge(r.metrics, budgets.get((arch.family, r.mode)))
            runs.append({"mode": r.mode, "schedule": sched, "metrics": r.metrics,
                         "engagement": r.engagement.as_dict(), "verdict": verdict, "failures": why,
                         "abs_dlogprob": r.abs_dlogprob, "wall_s": r.wall_s,
                         "budget": budgets.get((arch.family, r.mode))})
            if progress:
                progress(runs[-1], head)
    return {**head, "runs": runs, "wall_s": time.perf_counter() - t0,
            "verdict": "fail" if any(r["verdict"] == "fail" for r in runs) else "pass"}
