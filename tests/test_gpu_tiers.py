"""The GPU tests' tiers (tests/gpu_tiers.py), checked on CPU: the merge tier (`nox -s gpu`) keeps
every kernel and decode kind of every family, only merge modes, and batch 1 and 512; the slow tier
gets the rest, marked ``slow``, with the same ids.

Oracle: the tier rule as the module docstring of tests/gpu_tiers.py states it.
"""

import pytest
import test_gdn_gpu
import test_kda_gpu
import test_mamba2_gpu
from gpu_tiers import MERGE_MODES, tiered

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


def test_mamba2_merge_tier_has_batch_1_and_512_of_every_kernel_and_decode():
    params = tiered(test_mamba2_gpu.BATCH_CASES, test_mamba2_gpu._batch_merge_tier)
    merge = [p.values for p in params if not p.marks]
    assert {(n, d) for g, b, n, d in merge if b == 1} == KINDS
    assert {(n, d) for g, b, n, d in merge if b == 512} == KINDS - {("triton-baseline", "speculative")}


def test_the_progress_log_keeps_each_finished_test_and_why_one_failed(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    import conftest

    log = tmp_path / "tests.jsonl"
    monkeypatch.setenv("REPLAYSSM_TEST_LOG", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def report(when, outcome, longrepr=None):
        return SimpleNamespace(nodeid="t.py::x[B8]", when=when, outcome=outcome, duration=1.23456,
                               failed=outcome == "failed", longrepr=longrepr)

    conftest.pytest_runtest_logreport(report("setup", "passed"))  # a passing setup is not a line
    conftest.pytest_runtest_logreport(report("call", "passed"))
    conftest.pytest_runtest_logreport(report("call", "failed", "trace\nAssertionError: [(0, 'poison', 'NaN')]"))
    lines = [json.loads(s) for s in log.read_text().splitlines()]
    assert [(d["when"], d["outcome"], d["seconds"]) for d in lines] == [("call", "passed", 1.235),
                                                                       ("call", "failed", 1.235)]
    assert lines[1]["reason"].endswith("AssertionError: [(0, 'poison', 'NaN')]") and "reason" not in lines[0]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")  # a worker leaves the line to the controller
    conftest.pytest_runtest_logreport(report("call", "passed"))
    assert len(log.read_text().splitlines()) == 2
