"""Property tests: the validation contract holds for any drawn scenario, for every registered kernel.

Oracle: the validation engine (``run_scenario``, the path of ``replayssm validate``) on
scenarios drawn by ``replayssm.scenarios.strategies``: fp64 reference, the literal-model
tolerance rule, the exact invariants and the repeat check.  Mutants are skipped (they must fail:
tests/jobs/test_mutation_gallery.py).  Profile from ``REPLAYSSM_FUZZ_PROFILE`` (default ``ci``:
derandomized; 20 scenarios per kernel in this run, 8 for the alternate literal kernels (policy
literals, legitimate variants), Triton kernels run through the interpreter on CPU 3 tiny ones;
``dev`` 200, ``nightly`` 2,000).  A failure is shrunk and saved under failures/ for
``replayssm validate --scenario failures/<family>-<kernel>.json``.
"""

from pathlib import Path

import pytest
from hypothesis import given

from replayssm.families import family_names
from replayssm.scenarios.strategies import scenarios
from replayssm.validators.jobs.fuzz.run import (
    check_scenario,
    ci_examples,
    fuzz_kernel,
    fuzz_settings,
    fuzzable_kernels,
    profile_name,
)

FAILURES = Path(__file__).resolve().parents[2] / "failures"
KERNELS = fuzzable_kernels()


pytestmark = pytest.mark.usefixtures("one_thread")


def test_registry_has_kernels_of_every_family():
    fams = {cls.family for cls in KERNELS}
    assert fams == set(family_names())
    assert all(cls.kind != "mutant" for cls in KERNELS)


# The calibration population's variants (replayssm/ops/<family>/variants.py) are drawn by `replayssm
# calibrate` (tests/jobs/test_calibration.py, the calibration profile); their fuzz cases run in the slow tier.
CALIBRATION_VARIANTS = {"literal-replay-fp32-records", "literal-replay-fp64-weights", "literal-replay-ieee-dot",
                        "literal-replay-other-norm", "literal-replay-unfused-fold", "literal-replay-tf32-truncated"}


# The bookkeeping policies' literal models (replayssm/ops/literal.py, literal_staged.py,
# literal_next_verify.py) are one code for every family: the quick run fuzzes them on Mamba-2, the slow
# tier on GDN and KDA too (3-5 s each under the interpreter's load; ./dev test keeps its 10 minutes).
POLICY_LITERALS = {"literal-replay-flush-when-full", "literal-replay-fold-at-commit",
                   "literal-replay-fold-every-commit", "literal-replay-host-cursors",
                   "literal-replay-staged", "literal-replay-fold-at-next-verify"}


# GDN and KDA are one code where replayssm/ops/delta_rule holds it (the literal base and its orders, the
# Triton replay and baseline kernels, a per-channel-gate constexpr apart): the quick run fuzzes GDN's replay
# kernels and literal models, Mamba-2's baselines and replay kernels; the slow tier the delta-rule baselines,
# KDA's shared ones, Mamba-2's triton-replay-state (a storage variant of triton-replay) and its Triton baseline
# (validated on every schedule by tests/ops/mamba2) (10-16 s each under
# the interpreter; ./dev test keeps its 10 minutes; every one of them is validated by its family's quick tests).
SHARED_CODE_SLOW = {("gdn", "literal-baseline"), ("kda", "literal-baseline"), ("kda", "triton-baseline"),
                    ("gdn", "triton-baseline"), ("kda", "triton-replay"), ("kda", "literal-replay"),
                    ("kda", "literal-replay-cumprod"), ("kda", "literal-replay-recurrent"),
                    ("mamba2", "triton-replay-state"), ("mamba2", "triton-baseline")}


def _quick(c) -> bool:
    return (c.name not in CALIBRATION_VARIANTS and not (c.name in POLICY_LITERALS and c.family != "mamba2")
            and (c.family, c.name) not in SHARED_CODE_SLOW)


@pytest.mark.parametrize("cls", [c if _quick(c) else pytest.param(c, marks=pytest.mark.slow) for c in KERNELS],
                         ids=[f"{c.family}-{c.name}" for c in KERNELS])
def test_validation_contract_holds_for_drawn_scenarios(cls):
    n = None  # dev / nightly: the profile's own count
    if profile_name() == "ci":
        n = ci_examples(cls)
    report = fuzz_kernel(cls, max_examples=n, failures_dir=FAILURES)
    msg = report.summary()
    if report.record is not None:
        msg += f"\n{report.record.message}\nreplay: replayssm validate --scenario {report.artifact}"
    assert not report.caught, msg
    assert report.examples >= (n or 1)


# The strategies compose in a kernel author's own @given test: the pattern docs/fuzzing.md shows.
@fuzz_settings(max_examples=10)
@given(scenarios(kernel="literal-replay", family="gdn", max_steps=12, max_rows=2))
def test_strategies_compose_with_given(sc):
    res = check_scenario(sc, "literal-replay")
    assert res.passed and res.steps_run == len(sc.schedule_params["accepted"])
