"""pytest plugin: validate a kernel from a kernel author's own test suite in one line.

Oracle: :func:`replayssm.validators.run_scenario` (the same checks as ``replayssm validate``);
this module only turns its result into a test failure with a ``torch.testing.assert_close``-style
message (what mismatched, where first, by how much, against which bound).

Use (the plugin is registered as a ``pytest11`` entry point, nothing to configure)::

    def test_my_kernel(replayssm_validate):
        replayssm_validate(MyKernel, Scenario.tiny("mamba2", mode="s32a16", schedule="exhaustive"))

or without the fixture: ``from replayssm.validators.pytest_plugin import assert_kernel_valid``.
``--replayssm-out DIR`` writes every result's JSON and Markdown into DIR.

Loading this module must never break pytest startup: it imports only pytest at module level.
"""

from __future__ import annotations

import re

import pytest


def _format_failure(res) -> str:
    f = res.first_failure
    lines = [f"Kernel {res.kernel!r} is not valid for {res.family} at precision {res.mode}!", ""]
    total = sum(res.failure_counts.values())
    lines.append(f"Mismatched checks: {total} failure(s) in {res.steps_run} step(s): "
                 + ", ".join(f"{c} {n}" for c, n in sorted(res.failure_counts.items())))
    if f is not None:
        lines.append(f"First failure at {f.describe()}")
        if f.value is not None and f.bound is not None:
            lines.append(f"Greatest absolute difference at that step: {f.value:.6g} (allowed {f.bound:.6g})")
    worst = res.summary.get("worst bound_ratio")
    if worst is not None:
        lines.append(f"Worst error / tolerance bound over the run: {worst:.3g}")
    if res.exception:
        lines.append(f"The kernel raised at step {res.exception['step']}: {res.exception['type']}: "
                     f"{res.exception['message']}")
    lines += ["", f"Scenario: {_compact_json(res.scenario)}"]
    return "\n".join(lines)


def _compact_json(d) -> str:
    import json
    return re.sub(r"\s+", " ", json.dumps(d))


def assert_kernel_valid(kernel, scenario=None, *, device="cpu", out_dir=None, **options):
    """Run ``kernel`` (registered name, KernelUnderTest subclass) on ``scenario`` (default: the
    exhaustive tiny speculative scenario of the kernel's family) and raise ``AssertionError``
    with an assert_close-style message when any check fails.  Returns the ValidationResult.
    ``options`` go to ``run_scenario`` (``literal_every``, ``repeat_check`` ...)."""
    from replayssm.registry import get
    from replayssm.scenarios.scenario import Scenario
    from replayssm.validators.engine.runner import run_scenario

    if scenario is None:
        family = getattr(kernel, "family", None)
        if not family:
            raise ValueError("scenario: pass a Scenario (a kernel name alone does not say its family)")
        scenario = Scenario.tiny(family, schedule="exhaustive")
    if isinstance(kernel, str):
        get(kernel, scenario.family)  # importing the runner registered every mutant by name
    res = run_scenario(scenario, kernel, device=device, **options)
    if out_dir is not None:
        res.save(out_dir, stem=re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{res.kernel}-{scenario.label}"))
    if not res.passed:
        raise AssertionError(_format_failure(res))
    return res


def pytest_addoption(parser):
    group = parser.getgroup("replayssm")
    group.addoption("--replayssm-out", default=None, metavar="DIR",
                    help="replayssm: write each validation result (JSON + Markdown) into DIR")


@pytest.fixture
def replayssm_validate(request):
    """``replayssm_validate(kernel, scenario=None, **options)``: :func:`assert_kernel_valid`,
    saving results under ``--replayssm-out`` when given."""
    out = request.config.getoption("--replayssm-out", default=None)

    def validate(kernel, scenario=None, **options):
        return assert_kernel_valid(kernel, scenario, out_dir=out, **options)

    return validate
