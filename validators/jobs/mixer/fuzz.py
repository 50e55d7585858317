"""Property-based fuzzing of a mixer kernel: Hypothesis draws mixer scenarios, the mixer runner judges them.

Oracle: :meth:`MixerScenario.run` (``validators/engine/mixer/runner.py``: the fp64 whole-step
reference, the literal mixer's tolerance rule, the committed conv window read by the kernel's
declared design and compared bit for bit, padding rows and unnamed slots untouched).  Nothing is
re-implemented: a drawn scenario fails exactly when the runner's result does not pass.

What is drawn (:func:`mixer_scenarios`): the family, the precision mode (those the kernel and its SSM
kernel take), T' (1 is standard decode; up to d_conv + 2 so counts above d_conv - 1 are accepted),
the history block, slots and rows, per step the rows' slots (padding rows, permuted), each row's
accepted count 1..T' (partial acceptance) and the slots re-admitted before the step (a new sequence in
a reused slot), and the seed.  The conv policy is the kernel's declaration: the default kernel list
holds the literal mixer of each of the four designs.  Profiles: :mod:`validators.jobs.fuzz.run`'s
(``ci`` derandomized, ``dev``, ``nightly``); the ``ci`` profile catches every mixer mutant
(tests/jobs/test_mixer_jobs.py).  A failure is shrunk and saved as ``mixer-<family>-<kernel>.json``
(``replayssm validate --level mixer --scenario FILE`` replays it).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from replayssm.interface import PAD_SLOT
from replayssm.mixer.kernel import ComposedMixer, MixerKernel, mixer_kernel, mixer_kernels
from replayssm.mixer.spec import mixer_preset, mixer_specs
from replayssm.scenarios.strategies import FUZZ_MODES
from replayssm.validators.engine.mixer.runner import Failure, MixerPlan
from replayssm.validators.engine.mixer.scenario import MixerScenario, mixer_reason, save_artifact
from replayssm.validators.jobs.fuzz.run import fuzz_settings, profile_name

# Strategy sizes: the literal mixers are eager PyTorch on CPU; interpreted Triton ones cost more.
STRATEGY = {"max_steps": 10, "max_rows": 2, "max_slots": 3, "max_window": 6}
INTERPRETED_STRATEGY = {"max_steps": 4, "max_rows": 2, "max_slots": 3, "max_window": 5}


def is_mutant(cls: type[MixerKernel]) -> bool:
    return cls.name.startswith("mutant-")


def is_interpreted(cls: type[MixerKernel], device: str = "cpu") -> bool:
    """A mixer with Triton code (its conv or its SSM kernel) on a CPU: the Triton interpreter, slow."""
    ssm = getattr(cls, "ssm_kernel", "") if issubclass(cls, ComposedMixer) else ""
    triton = "triton" in cls.name or "triton" in ssm or getattr(cls, "triton_conv", False)
    return str(device).startswith("cpu") and triton


def fuzzable_mixers(include_mutants: bool = False) -> list[type[MixerKernel]]:
    return [c for c in mixer_kernels().values() if include_mutants or not is_mutant(c)]


def drawable(cls: type[MixerKernel], families, modes, d_conv: int = 4) -> dict[tuple[str, str], tuple[str, ...]]:
    """``(family, decode kind) -> modes`` the kernel can run (its reason and its SSM kernel's)."""
    out = {}
    for fam in families:
        g = mixer_preset("tiny", fam, d_conv)
        for T in (1, 2):
            plan = MixerPlan(1, T, T, (((0,), (1,)),))
            ok = []
            for m in modes:
                try:
                    if mixer_reason(cls, g, m, plan) is None:
                        ok.append(m)
                except ValueError:  # its SSM kernel is not registered for the family
                    continue
            if ok:
                out[(fam, plan.decode.decode)] = tuple(ok)
    return out


@st.composite
def mixer_scenarios(draw, table: dict, max_steps: int = 10, max_rows: int = 3, max_slots: int = 4,
                    max_window: int = 6, d_conv: int = 4) -> MixerScenario:
    """A mixer scenario over ``table`` (:func:`drawable`)."""
    fam, kind = draw(st.sampled_from(sorted(table)))
    mode = draw(st.sampled_from(table[(fam, kind)]))
    T = 1 if kind == "standard" else draw(st.integers(2, max_window))
    B = draw(st.integers(1, 8)) if T == 1 else draw(st.integers(T, T + 6))
    S = draw(st.integers(1, max_slots))
    R = draw(st.integers(1, max_rows))
    steps, resets = [], []
    for i in range(draw(st.integers(1, max_steps))):
        again = ()
        if i > 0 and draw(st.integers(0, 3)) == 3:
            again = tuple(draw(st.lists(st.integers(0, S - 1), min_size=1, max_size=S, unique=True)))
        act = draw(st.lists(st.integers(0, S - 1), min_size=1, max_size=min(R, S), unique=True))
        ids = tuple(draw(st.permutations(act + [PAD_SLOT] * (R - len(act)))))
        ks = tuple(0 if s == PAD_SLOT else draw(st.integers(1, T)) for s in ids)
        steps.append((ids, ks))
        resets.append(again)
    plan = MixerPlan(S, T, B, tuple(steps), tuple(resets))
    return MixerScenario(fam, mode, plan, draw(st.integers(0, 2**16)), "tiny", d_conv)


@dataclass
class MixerFuzzReport:
    """What one fuzzing run of one mixer kernel found."""

    kernel: str
    families: tuple[str, ...]
    profile: str
    examples: int = 0
    caught: bool = False
    time_to_first_failure_s: float | None = None
    wall_s: float = 0.0
    scenario: MixerScenario | None = None
    failure: Failure | None = None
    verdict: str = ""
    artifact: Path | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        fams = ",".join(self.families)
        if not self.caught:
            return (f"PASS {self.kernel} [mixer, {fams}]: {self.examples} scenarios, {self.wall_s:.1f} s "
                    f"({self.profile})")
        sc, f = self.scenario, self.failure
        rows, steps = sc.size
        return (f"FAIL {self.kernel} [mixer, {sc.family}]: first failure after {self.time_to_first_failure_s:.1f} s, "
                f"shrunk to {rows} active row(s) x {steps} step(s), {sc.mode} T'={sc.plan.window} "
                f"B={sc.plan.buffer}; [{f.check}] at step {f.step}" + (f" -> {self.artifact}" if self.artifact else ""))

    def to_dict(self) -> dict:
        return {"level": "mixer", "kernel": self.kernel, "families": list(self.families), "profile": self.profile,
                "examples": self.examples, "caught": self.caught,
                "time_to_first_failure_s": self.time_to_first_failure_s, "wall_s": round(self.wall_s, 3),
                "scenario": None if self.scenario is None else self.scenario.to_dict(),
                "failure": None if self.failure is None else vars(self.failure), "verdict": self.verdict,
                "artifact": None if self.artifact is None else str(self.artifact), "notes": self.notes}


def fuzz_mixer(kernel, *, families=None, modes=None, profile: str | None = None, device: str = "cpu",
               failures_dir=None, max_examples: int | None = None, seed: int | None = None,
               shrink_budget_s: float | None = 20.0, shrink_budget_examples: int | None = None,
               strategy: dict | None = None) -> MixerFuzzReport:
    """Fuzz one mixer kernel (a class or a registered name) under ``profile``; never raises for a kernel
    failure.  ``families`` (default: every family with a mixer) and ``modes`` (default: the fuzzed
    modes) bound the draws; ``shrink_budget_s`` / ``shrink_budget_examples`` bound the shrinking as in
    :func:`validators.jobs.fuzz.run.fuzz_kernel` (past it a candidate not seen failing counts as passing)."""
    cls = mixer_kernel(kernel) if isinstance(kernel, str) else kernel
    name = profile_name(profile)
    fams = tuple(families or sorted(mixer_specs()))
    table = drawable(cls, fams, tuple(modes or FUZZ_MODES))
    if not table:
        raise ValueError(f"--modes: mixer kernel {cls.name} runs none of {list(modes or FUZZ_MODES)} for "
                         f"{list(fams)} here")
    skw = dict(INTERPRETED_STRATEGY if is_interpreted(cls, device) else STRATEGY)
    skw.update(strategy or {})
    report = MixerFuzzReport(cls.name, tuple(sorted({f for f, _ in table})), name)
    failing: dict[str, object] = {}
    state: dict = {"last": None, "first_n": None}
    t0 = time.perf_counter()

    def prop(sc: MixerScenario) -> None:
        key = repr(sc.to_dict())
        res = failing.get(key)
        if res is None:
            t_first, n_first = report.time_to_first_failure_s, state["first_n"]
            if (shrink_budget_s is not None and t_first is not None
                    and time.perf_counter() - t0 - t_first > shrink_budget_s) or (
                    shrink_budget_examples is not None and n_first is not None
                    and report.examples - n_first >= shrink_budget_examples):
                return
            report.examples += 1
            res = sc.run(cls, device=device, max_failures=1)
            if res.passed:
                return
            if report.time_to_first_failure_s is None:
                report.time_to_first_failure_s = time.perf_counter() - t0
                state["first_n"] = report.examples
            failing[key] = res
        state["last"] = (sc, res)
        raise AssertionError(res.verdict())

    test = given(mixer_scenarios(table, **skw))(functools.wraps(prop)(lambda sc: prop(sc)))
    hyp = {} if max_examples is None else {"max_examples": max_examples}
    test = fuzz_settings(name, **hyp)(test)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        test()
    except AssertionError:
        report.caught = True
    report.wall_s = time.perf_counter() - t0
    if report.caught and state["last"] is not None:
        sc, res = state["last"]
        report.scenario, report.failure, report.verdict = sc, res.first_failure, res.verdict()
        if failures_dir is not None:
            try:
                report.artifact = save_artifact(failures_dir, sc, cls.name, res)
            except OSError as e:
                report.notes.append(f"the reproducer could not be written to {failures_dir}: "
                                    f"{e.strerror or type(e).__name__}")
    return report
