"""The GPU tests' tiers (tests/gpu_tiers.py), checked on CPU: the merge tier (`nox -s gpu`) keeps
every kernel and decode kind of every family, only merge modes, and batch 1 and 512; the slow tier
gets the rest, marked ``slow``, with the same ids.

Oracle: the tier rule as the module docstring of tests/gpu_tiers.py states it.
"""

import sys
from pathlib import Path

import pytest
from gpu_tiers import BIG_MEMORY, FULL_MODE, MERGE_MODES, mode_path_in_merge_tier, tiered

# The GPU test modules live in their groups' folders; pytest imports each under its basename with its
# folder first on sys.path ("prepend" import mode), and so do these lines.
_TESTS = Path(__file__).resolve().parents[1]
for _d in ("adapters", "ops/gdn", "ops/kda", "ops/mamba2"):
    if str(_TESTS / _d) not in sys.path:
        sys.path.insert(0, str(_TESTS / _d))
import test_adapters_gpu  # noqa: E402
import test_gdn_gpu  # noqa: E402
import test_kda_gpu  # noqa: E402
import test_mamba2_gpu  # noqa: E402

KINDS = {(n, d) for n in ("triton-replay", "triton-baseline") for d in ("standard", "speculative")}


def test_tiered_marks_the_rest_slow_and_keeps_ids():
    params = tiered([("a", 1), ("b", 2)], lambda v: v[0] == "a", ids=["x-a", "x-b"])
    assert [p.id for p in params] == ["x-a", "x-b"] and [p.values for p in params] == [("a", 1), ("b", 2)]
    assert params[0].marks == () and [m.name for m in params[1].marks] == ["slow"]


@pytest.mark.parametrize("mod", [test_gdn_gpu, test_kda_gpu], ids=["gdn", "kda"])
def test_merge_tier_keeps_every_kernel_and_decode_in_merge_modes(mod):
    merge = [c for c in mod.CASES if mod._merge_tier(c[1:])]
    assert {(name, sc.decode) for _, name, sc in merge} == KINDS
    assert {sc.mode for _, _, sc in merge} <= MERGE_MODES
    assert any(sc.schedule == "exhaustive" for _, _, sc in merge)
    assert any(sc.rows == 1 for _, _, sc in merge)  # batch 1 (batch 512: test_engine_gpu_batch512, all merge)
    slow = [c for c in mod.CASES if not mod._merge_tier(c[1:])]
    assert slow and {sc.mode for _, _, sc in slow} - MERGE_MODES  # the other modes run in the slow tier


@pytest.mark.parametrize("mod,serving", [(test_gdn_gpu, "qwen35-4b"), (test_kda_gpu, "kimi-linear-48b")],
                         ids=["gdn", "kda"])
def test_merge_tier_runs_each_storage_kind_once_on_the_automatic_path(mod, serving):
    merge = [sc for _, _, sc in mod.CASES if mod._merge_tier((None, sc))]
    assert {sc.mode for sc in merge} == MERGE_MODES & {sc.mode for _, _, sc in mod.CASES}
    others = [sc for sc in merge if sc.mode != FULL_MODE]
    assert others and not any(sc.kernel_options.get("prepass") for sc in others)
    assert all(sc.decode == "speculative" for sc in others if "tf32" not in sc.mode)
    assert any(sc.kernel_options.get("prepass") for sc in merge if sc.mode == FULL_MODE)  # both paths of it
    assert all(sc.mode == FULL_MODE and sc.decode == "speculative" for sc in merge if sc.geometry != serving)


def test_mamba2_merge_tier_runs_both_paths_of_the_full_mode_only():
    merge = [c for c in test_mamba2_gpu.MODE_PATHS if mode_path_in_merge_tier(c)]
    assert {p for m, p in merge if m == FULL_MODE} == {"prepass", "fused"}
    assert {m for m, _ in merge} == MERGE_MODES and all(p == "fused" for m, p in merge if m != FULL_MODE)


def _params(test, argnames: str):
    return next(m for m in test.pytestmark if m.name == "parametrize" and m.args[0] == argnames).args[1]


@pytest.mark.parametrize("test,argnames,is_big", [
    (test_mamba2_gpu.test_batch_sizes, "geometry,batch,name,decode", lambda p: p.values[1] >= 512),
    (test_adapters_gpu.test_adapter_bridges_hold_at_real_geometry, "batch", lambda p: p.values[0] == 512),
], ids=["mamba2-batch-sizes", "adapters"])
def test_the_batch_512_cases_share_one_xdist_group(test, argnames, is_big):
    params = _params(test, argnames)
    big = [p for p in params if BIG_MEMORY in p.marks]
    assert big and all(is_big(p) for p in big) and not any(is_big(p) for p in params if p not in big)
    assert BIG_MEMORY.mark.args == ("gpu-big-memory",)


def test_the_merge_tier_builds_one_flashinfer_module_per_kernel():
    params = _params(test_adapters_gpu.test_adapter_bridges_hold_at_real_geometry, "family,name,decode,mode")
    merge = [p.values for p in params if not p.marks]
    assert {n for _, n, _, _ in merge if n.startswith("flashinfer-")} == {"flashinfer-baseline", "flashinfer-replay"}
    assert len([n for _, n, _, _ in merge if n.startswith("flashinfer-")]) == 2
    assert len(merge) == len(params) - 7  # every other adapter case stays in the merge tier at batch 8


def test_the_whole_batch_512_tests_of_gdn_and_kda_share_it():
    for test in (test_gdn_gpu.test_engine_gpu_batch512, test_kda_gpu.test_engine_gpu_batch512):
        assert BIG_MEMORY.mark in test.pytestmark


def test_the_report_log_holds_each_test_as_it_finishes(tmp_path):
    """The GPU tiers' profiles pass ``--report-log`` (pytest-reportlog): a run cut by its time limit
    must still tell how each finished test ended and why one failed, so a report is on disk before
    the next test starts (the second test reads the first one's line back)."""
    import json
    import subprocess
    import sys

    log = tmp_path / "tests.jsonl"
    (tmp_path / "test_t.py").write_text(
        "import json\n"
        "def test_a():\n    assert False, 'poison NaN'\n"
        f"def test_b():\n    lines = [json.loads(s) for s in open({str(log)!r})]\n"
        "    assert any(d.get('nodeid', '').endswith('test_a') and d.get('when') == 'call'"
        " and d.get('outcome') == 'failed' for d in lines)\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "--report-log", str(log), str(tmp_path / "test_t.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr  # test_a fails, test_b passes
    reports = [json.loads(s) for s in log.read_text().splitlines()]
    outcomes = {d["nodeid"].split("::")[-1]: d["outcome"] for d in reports if d.get("when") == "call"}
    assert outcomes == {"test_a": "failed", "test_b": "passed"}, run.stdout
    assert "poison NaN" in json.dumps([d["longrepr"] for d in reports if d.get("outcome") == "failed"])
