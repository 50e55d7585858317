"""The CPU findings of docs/findings.md are regression tests: each step of the ``findings-cpu`` profile
re-run gives the verdict its newest ledger record holds.

Oracle: the ledger (docs/reports/ledger.jsonl): the ``validate`` records the profile wrote (source
``... --out .../findings-cpu/SECTION``), matched by kernel and configuration digest (the scenario the
run resolved: same digest, same case).  Expected: the same verdict (pass, fail or marginal) -- a
kernel whose finding changes (an adapter fixed upstream, a rule that moved) fails here and the
findings' generated tables need re-measuring (``replayssm profile findings-cpu --record FILE``).
Slow tier (``nox -s tests_slow``): the profile's 46 runs take minutes under the interpreter; the
quick run keeps the adapters' own bridge tests (tests/adapters/test_adapters_sglang_kernels.py, ...).
Skipped per step when the adapter's source is not there (sglang, mamba-ssm, fla-core).
"""

import json
from pathlib import Path

import pytest

from replayssm import adapters
from replayssm.cli import main
from replayssm.cli_profile import load_profiles

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "reports" / "ledger.jsonl"
STEPS = load_profiles()["findings-cpu"].steps
SOURCE_OF = {"sglang-": "sglang", "mamba-ssm-": "mamba_ssm", "fla-": "fla"}


def _recorded() -> dict[tuple[str, str], dict]:
    """The newest findings-cpu validate record per (kernel, config digest)."""
    newest = {}
    for line in LEDGER.read_text().splitlines():
        r = json.loads(line)
        if r["job"] == "validate" and "/findings-cpu/" in r["source"]:
            key = (r["kernel"], r["config_digest"])
            if key not in newest or r["created"] >= newest[key]["created"]:
                newest[key] = r
    return newest


def _kernel(step) -> str:
    return step.args[step.args.index("--kernel") + 1]


def _ids(step) -> str:
    a = step.args
    fam, mode, dec = a[a.index("--family") + 1], a[a.index("--precision") + 1], a[a.index("--decode") + 1]
    shape = (f"T{a[a.index('--window') + 1]}" if dec == "speculative" else "L") + f"-B{a[a.index('--buffer') + 1]}" \
        if "--buffer" in a else dec
    dist = a[a.index("--distribution") + 1]
    return f"{fam}-{_kernel(step)}-{mode}-{dec}-{shape}-{dist}"


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS, ids=[f"{i:02d}-{_ids(s)}" for i, s in enumerate(STEPS)])
def test_a_cpu_finding_keeps_its_recorded_verdict(step, tmp_path, capsys):
    kernel = _kernel(step)
    source = next((s for prefix, s in SOURCE_OF.items() if kernel.startswith(prefix)), None)
    if source is not None:
        ok, line = adapters.load()[source]
        if not ok:
            pytest.skip(line)
    rec = tmp_path / "rec.jsonl"
    args = [a.replace("{device}", "cpu").replace("{out}", str(tmp_path)) for a in step.args]
    rc = main([*args, "--record", str(rec)])
    [r] = [json.loads(line) for line in rec.read_text().splitlines()]
    old = _recorded().get((r["kernel"], r["config_digest"]))
    assert old is not None, f"no findings-cpu record of {r['case']} (digest {r['config_digest']}) in the ledger"
    assert (r["verdict"], rc) == (old["verdict"], 1 if old["verdict"] == "fail" else 0), (
        f"{r['case']}: verdict {r['verdict']} (exit {rc}), recorded {old['verdict']} in rec:{old['id']}")


def test_every_findings_cpu_step_has_a_record_in_the_ledger():
    """The generated tables cover the whole profile: one record per step's kernel and scenario (what
    the slow test re-runs is what the docs show)."""
    kernels_recorded = {k for k, _ in _recorded()}
    assert {_kernel(s) for s in STEPS} <= kernels_recorded
    assert len(_recorded()) >= len(STEPS)
