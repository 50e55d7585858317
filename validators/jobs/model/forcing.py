"""Teacher forcing at the model level: the student decodes a token stream through the kernel under
test under forced acceptance schedules; its next-token distributions are compared with the teacher's.

Oracle: the teacher is the same model's prefill of the same stream with every recurrent mixer's
recurrence in fp64 (``mixer.py``'s ``"reference"``; every other layer in the model's dtype, fp64 where
the model runs in it).  The student runs the same weights, the attention layers through their own KV
cache (cropped to the committed length after each commit), each mixer through the kernel's
``verify`` on a window of T' stream tokens and ``commit(k)`` with the schedule's k; the student's
distribution at a position is the one of the verify that committed it.

Metrics per run (positions 0..N-1, r = log q(x) - log p(x) of the stream's next token x):
k3-KL ``mean(exp(r) - 1 - r)``, the exact KL(p || q) over the vocabulary, p95 and max |r|, top-1
agreement; engagement counters (verifies, flushes, ring wraps, rejected tokens, rollbacks).

Expected error: at s64a64 the student equals the teacher to ~1e-10 in log-probability (the kernel's
fp64 replay against the fp64 recurrence); other modes by their state and activation rounding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.validators.jobs.model import gdn, hf, kda, mamba2

SCHEDULES = {
    "always-1": "k = 1 (every draft rejected, the bonus token kept)",
    "random": "k uniform in 1..T' per step",
    "always-T": "k = T' (every draft accepted)",
    "reject-then-accept": "k = 1 for the first half of the stream, then k = T'",
}
ADAPTERS = {"gdn": gdn, "mamba2": mamba2, "kda": kda}


def schedule_k(name: str, rng: np.random.Generator, window: int, pos: int, tokens: int) -> int:
    if name == "always-1":
        return 1
    if name == "always-T":
        return window
    if name == "random":
        return int(rng.integers(1, window + 1))
    if name == "reject-then-accept":
        return 1 if pos < tokens // 2 else window
    raise ValueError(f"schedules: expected names from {sorted(SCHEDULES)}, got {name!r}")


class LateByOne:
    """Mutant: the mixer output of token t is the one of token t-1 (the state published one token
    late); the first token of a sequence reads zeros."""

    name = "late-by-one"

    def __init__(self) -> None:
        self.prev = None
        self.last = None

    def __call__(self, o):
        prev = torch.zeros_like(o[:1]) if self.prev is None else self.prev
        self.last = o
        return torch.cat([prev, o[:-1]], dim=0)

    def commit(self, k: int) -> None:
        self.prev = self.last[k - 1:k]


class ScratchKVRollback:
    """Mutant (rMLX #436): on a rollback the mixers discard the window (``commit(0)``) and are advanced
    again by replaying the kept prefix through the model with a scratch, empty KV cache in place of
    the attention layers' own: every mixer after the first attention layer advances on a hidden state
    computed without the context.  The verify's logits and the attention layers' own cache stay right.
    The replay runs the whole window (a kernel verifies T' tokens) and commits k: causal, so the kept
    prefix's states see only the kept prefix."""

    name = "scratch-kv-rollback"


MUTANTS = {"late-by-one": LateByOne, "scratch-kv-rollback": ScratchKVRollback}
HOOKS = ("late-by-one",)


@dataclass
class Engagement:
    verifies: int = 0
    flushes: int = 0
    wraps: int = 0
    rejected_tokens: int = 0
    rollbacks: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class StudentRun:
    mode: str
    schedule: str
    metrics: dict
    engagement: Engagement
    abs_dlogprob: list = field(default_factory=list)
    wall_s: float = 0.0


def mixers_of(model, arch) -> list:
    return ADAPTERS[arch.family].install(model)


def teacher_logits(model, mixers, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's logits ``[N, vocab]`` (fp64, on the host) and final hidden states (on the model's
    device) of the stream ``ids``."""
    for m in mixers:
        m.driver, m.hook = "reference", None
    dev = model.device
    with torch.no_grad():
        out = model(ids[None].to(dev), output_hidden_states=True, use_cache=False)
    return out.logits[0].to("cpu", torch.float64), out.hidden_states[-1][0]


def _attention_layers(model) -> list[int]:
    return [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]


def student_logits(model, mixers, ids: torch.Tensor, tokens: int, kernel: str, mode, decode: DecodeConfig,
                   schedule: str, seed: int, device="cpu", mutant: str | None = None, options: dict | None = None):
    """The student's logits at positions 0..tokens-1 (``ids`` holds tokens + T' stream tokens; the
    logits come back on the host) and its :class:`Engagement`. The model runs where its weights are."""
    T = decode.window
    dev = model.device
    for m in mixers:
        m.start(kernel, mode, decode, device, options)
        m.hook = MUTANTS[mutant]() if mutant in HOOKS else None
    cache = hf.new_cache(model)
    attn = _attention_layers(model)
    rng = np.random.default_rng(seed)
    eng = Engagement()
    wp, origin = 0, 0
    out = torch.empty(tokens, model.config.vocab_size, dtype=torch.float64)
    n = 0
    with torch.no_grad():
        while n < tokens:
            k = schedule_k(schedule, rng, T, n, tokens)
            flush = decode.is_flush(wp)
            pos = torch.arange(n, n + T, device=dev)[None]
            window = ids[None, n:n + T].to(dev)
            logits = model(window, past_key_values=cache, position_ids=pos, use_cache=True).logits[0]
            if mutant == ScratchKVRollback.name and k < T:
                for m in mixers:
                    m.commit(0)
                model(window, past_key_values=hf.new_cache(model), position_ids=pos, use_cache=True)
            for m in mixers:
                m.commit(k)
                if m.hook is not None:
                    m.hook.commit(k)
            if k < T:
                for i in attn:
                    cache.layers[i].crop(-(T - k))
                eng.rollbacks += 1
                eng.rejected_tokens += T - k
            eng.verifies += 1
            eng.flushes += int(flush)
            new_wp, new_origin = decode.commit_cursor(wp, origin, flush, k)
            eng.wraps += int(new_origin < origin)
            wp, origin = new_wp, new_origin
            keep = min(k, tokens - n)
            out[n:n + keep] = logits[:keep].to("cpu", torch.float64)
            n += k
    return out, eng


def compare(teacher: torch.Tensor, student: torch.Tensor, next_ids: torch.Tensor) -> tuple[dict, list]:
    """Metrics of the student's distributions against the teacher's at every position (see the module
    docstring) and the per-position |Δlogprob|."""
    lp, lq = torch.log_softmax(teacher, -1), torch.log_softmax(student, -1)
    r = (lq.gather(1, next_ids[:, None]) - lp.gather(1, next_ids[:, None]))[:, 0]
    a = r.abs()
    kl = (lp.exp() * (lp - lq)).sum(-1)
    metrics = {"k3_kl": float((torch.exp(r) - 1 - r).mean()), "kl_exact": float(kl.mean()),
               "kl_exact_max": float(kl.max()), "p95_abs_dlogprob": float(torch.quantile(a, 0.95)),
               "max_abs_dlogprob": float(a.max()),
               "top1_agreement": float((lp.argmax(-1) == lq.argmax(-1)).double().mean()),
               "tokens": int(r.numel())}
    return metrics, a.tolist()


def run_student(model, mixers, ids, teacher, tokens, kernel, mode, decode, schedule, seed, device="cpu",
                mutant=None, options=None) -> StudentRun:
    t0 = time.perf_counter()
    q, eng = student_logits(model, mixers, ids, tokens, kernel, parse_mode(mode), decode, schedule, seed, device,
                            mutant, options)
    metrics, series = compare(teacher[:tokens], q, ids[1:tokens + 1])
    if not all(math.isfinite(v) for v in metrics.values()):
        metrics["non_finite"] = True
    return StudentRun(parse_mode(mode).id, schedule, metrics, eng, series, time.perf_counter() - t0)
