"""The orchestrator's two executions give the same verdicts and metrics on every family, spec and standard.

Oracle: the eager execution (``Lockstep.step`` every step: ``CellRun(fast=False)``).  The captured
execution (drift's fast path on the fixed buffers a CUDA graph captures, run eagerly on a CPU:
``FastCell(static=True)``; and its default CPU form) must give the same cell result -- verdict
(failure counts and failures), curves, flush and state errors, blocks, token counts -- as JSON text,
and leave the orchestrator's bookkeeping (cursors, coverage keys in order, phases, tokens) the same.
A mutant whose outputs keep the NaN poison makes both report the same ``unwritten-output`` failures;
a kernel that raises ends the cell at the same step with the same message on both.
"""

from __future__ import annotations

import json

import pytest

from replayssm import registry
from replayssm.ops.mamba2.literal import Mamba2LiteralReplay
from replayssm.validators.jobs.drift.cell_run import CellRun
from replayssm.validators.jobs.drift.cells import SweepConfig
from replayssm.validators.jobs.drift.fast import FastCell

FAMILIES = ("mamba2", "gdn", "kda")
SCHEDULES = {"standard": 1, "spec-random": 4}  # schedule -> T'
CASES = [(fam, sched) for fam in FAMILIES for sched in SCHEDULES]


def _run(fam: str, kernel: str, sched: str, execution: str, tokens: int = 24) -> CellRun:
    cell = f"{fam}.{kernel}.s32a16.long-memory.{sched}"
    cfg = SweepConfig(families=(fam,), kernels=(kernel,), modes=("s32a16",), schedules=(sched,), tokens=tokens,
                      rows=2, local_every=2, blocks=8, geometry=((fam, "tiny"),))
    spec = next(c for c in cfg.cells()[0] if c.id == cell)
    run = CellRun(spec, cfg, chunk=8, fast=execution != "eager")
    if execution == "static":
        run.fast = FastCell(run, static=True)
    assert (run.fast is None) == (execution == "eager")
    while not run.done:
        run.run_steps(8)
    return run


def _bookkeeping(run: CellRun) -> tuple:
    ls = run.ls
    return (ls.wp, ls.origin, ls.step_idx, list(ls.coverage.items()), sorted(ls.phases), ls.tokens_accepted,
            ls.tokens_verified)


@pytest.mark.parametrize("fam, sched", CASES, ids=[f"{f}-s32a16-T{SCHEDULES[s]}-tiny" for f, s in CASES])
def test_eager_and_captured_executions_agree(fam, sched):
    eager = _run(fam, "literal-replay", sched, "eager")
    captured = _run(fam, "literal-replay", sched, "static")
    assert json.dumps(captured.result(), sort_keys=True) == json.dumps(eager.result(), sort_keys=True)
    assert _bookkeeping(captured) == _bookkeeping(eager)
    assert eager.result()["failure_counts"] == {} and eager.result()["exception"] is None


@pytest.mark.parametrize("fam", FAMILIES, ids=[f"{f}-s32a16-T1-tiny" for f in FAMILIES])
def test_executions_report_the_same_failures(fam):
    kernel = "mutant-output-element-unwritten"
    eager = _run(fam, kernel, "standard", "eager", tokens=16)
    captured = _run(fam, kernel, "standard", "fast", tokens=16)
    res = eager.result()
    assert res["failure_counts"].get("unwritten-output", 0) > 0, json.dumps(res)[:400]
    assert json.dumps(captured.result(), sort_keys=True) == json.dumps(res, sort_keys=True)


class _RaisesAtStep5(Mamba2LiteralReplay):
    """Raises at its 6th verify (a kernel error: the cell ends there, reported)."""

    name = "test-raises-at-step-5"
    calls = 0

    def verify(self, slot_ids, inputs, out=None):
        type(self).calls += 1
        if type(self).calls == 6:
            raise RuntimeError("kernel fault")
        return super().verify(slot_ids, inputs, out=out)


def test_executions_end_a_cell_at_the_same_kernel_error(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, ("mamba2", _RaisesAtStep5.name), _RaisesAtStep5)
    results = []
    for execution in ("eager", "fast"):
        _RaisesAtStep5.calls = 0
        res = _run("mamba2", _RaisesAtStep5.name, "standard", execution, tokens=16).result()
        line, _, tb = res.pop("exception").partition("\n")
        assert line == "step 5: RuntimeError: kernel fault" and "kernel fault" in tb
        results.append(json.dumps(res, sort_keys=True))
    assert results[0] == results[1]
