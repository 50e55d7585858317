"""Drift runs end to end on CPU: reports, budgets and --check, bad input, mid-cell resume, a
SIGKILLed run resumed to identical reports, shards merged to the unsharded report, worker processes.

Every comparison of reports is byte equality of the JSON, Markdown and HTML files (the fp64 parts
and, for these deterministic CPU kernels, the kernel parts too).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from replayssm.cli import main
from replayssm.validators.jobs.drift.budgets import load_budgets, parse_budgets
from replayssm.validators.jobs.drift.sweep import (
    CellRun,
    SweepConfig,
    default_chunk,
    dispatch_order,
    load_cells,
    parse_shard,
    run_sweep,
    shard_cells,
)

SMALL = ["--families", "mamba2,gdn", "--modes", "s32a16,sfp8a16", "--schedules", "standard,spec-random",
         "--tokens", "256", "--rows", "2", "--no-progress", "--checkpoint-every", "0"]
FILES = ("drift_report.json", "drift_report.md", "drift_report.html")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
# The module's reference run is shared: its tests run in one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("drift-runner")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "replayssm", "drift", *args]


def _reports(d: Path) -> dict[str, bytes]:
    return {f: (d / f).read_bytes() for f in FILES}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The unsharded, uninterrupted run of the small sweep (in this process, one worker), and a
    budget file derived from it."""
    out = tmp_path_factory.mktemp("drift-ref")
    code = main(["drift", *SMALL, "--out", str(out), "--workers", "1", "--write-budgets", str(out / "budgets.toml")])
    assert code == 0
    return out


def test_reports_are_complete_and_self_contained(reference):
    rep = json.loads((reference / "drift_report.json").read_text())
    assert rep["schema"] == "replayssm-drift-report" and rep["schema_version"] == 1
    assert len(rep["cells"]) == 8
    for c in rep["cells"]:
        assert c["output"]["fit"]["law"] in ("bounded", "sqrt", "linear", "exponential")
        assert c["flush"]["injected"]["basis"] == "local"
        assert c["output"]["samples"] == 2 * 256
    assert len(rep["speculation"]) == 4 and all(s["p_value"] is not None for s in rep["speculation"])
    assert {r["mode"] for r in rep["recommendations"]} <= {"s32a16", "sfp8a16", None}
    html = (reference / "drift_report.html").read_text()
    # One output and one state plot per cell's mode, two flush plots per family; nothing external.
    assert html.count("<svg") == 2 * 2 * 2 + 2 * 2
    assert "<script" not in html and "src=" not in html and 'href="http' not in html
    md = (reference / "drift_report.md").read_text()
    assert "| mamba2.literal-replay.sfp8a16.long-memory.standard |" in md
    # fp8 state drifts: the injected error per flush is percent-level, fp32 state's ~1e-7.
    by = {c["id"]: c for c in rep["cells"]}
    assert by["mamba2.literal-replay.sfp8a16.long-memory.standard"]["flush"]["injected"]["estimate"] > 1e-3
    assert by["mamba2.literal-replay.s32a16.long-memory.standard"]["flush"]["injected"]["estimate"] < 1e-6


def test_check_passes_within_budgets_and_fails_a_low_precision_kernel(reference, tmp_path):
    budgets = reference / "budgets.toml"
    b = load_budgets(budgets)
    assert ("mamba2", "s32a16") in b and b[("mamba2", "s32a16")].provenance["commit"]
    shutil.copytree(reference, tmp_path / "chk")  # the cells are done: this only re-analyses
    assert main(["drift", *SMALL, "--out", str(tmp_path / "chk"), "--check", "--budgets", str(budgets)]) == 0
    bad = ["drift", "--families", "mamba2", "--kernels", "mutant-low-precision-state", "--modes", "s32a16",
           "--schedules", "standard", "--tokens", "256", "--rows", "2", "--no-progress", "--workers", "1",
           "--out", str(tmp_path / "bad"), "--check", "--budgets", str(budgets)]
    assert main(bad) == 1
    rep = json.loads((tmp_path / "bad" / "drift_report.json").read_text())
    assert rep["check"]["pass"] is False
    assert any("state error" in f for f in rep["cells"][0]["check"]["failures"])


@pytest.mark.parametrize("args, field", [
    (["--modes", "s32a99"], "modes"),
    (["--kernels", "no-such-kernel"], "kernels"),
    (["--scenarios", "sunny"], "scenarios"),
    (["--schedules", "sometimes"], "schedules"),
    (["--geometry", "huge"], "geometry"),
    (["--shard", "2/2"], "shard"),
])
def test_bad_input_fails_before_any_work(tmp_path, capsys, args, field):
    out = tmp_path / "o"
    assert main(["drift", "--out", str(out), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert field in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_budget_file_with_missing_fields_fails_before_any_work(tmp_path, capsys):
    p = tmp_path / "b.toml"
    p.write_text('schema = 1\n[mamba2.s32a16]\noutput_error = 1e-3\nstate_error = 1e-3\ngrowth = ["sqrt"]\n'
                 'horizon = 100\nprovenance = { derived = "x", hardware = "cpu", date = "" }\n')
    out = tmp_path / "o"
    assert main(["drift", *SMALL, "--out", str(out), "--check", "--budgets", str(p)]) == 2
    err = capsys.readouterr().err
    assert "provenance" in err and "commit" in err and "date" in err
    assert not out.exists()


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["mamba2"]["s32a16"].pop("state_error"), "state_error"),
    (lambda d: d["mamba2"]["s32a16"].update(growth=["exponential"]), "growth"),
    (lambda d: d["mamba2"]["s32a16"].update(output_error=-1.0), "output_error"),
    (lambda d: d["mamba2"]["s32a16"].update(colour="red"), "unknown field"),
    (lambda d: d.update(schema=2), "schema"),
    (lambda d: d.update(mamba3={}), "mamba3"),
])
def test_budget_loader_names_the_bad_field(edit, needle):
    d = {"schema": 1, "mamba2": {"s32a16": {"output_error": 1e-3, "state_error": 1e-3, "growth": ["sqrt"],
                                            "horizon": 100, "provenance": {"derived": "x", "hardware": "cpu",
                                                                           "date": "2026-11-29", "commit": "abc"}}}}
    parse_budgets(json.loads(json.dumps(d)))
    edit(d)
    with pytest.raises(ValueError, match=needle):
        parse_budgets(d)
    with pytest.raises(ValueError, match="no entry"):
        parse_budgets({"schema": 1}).get_budget("gdn", "s16a16")


@pytest.mark.parametrize("cell", ["mamba2.literal-replay.sfp8a16-sr.long-memory.spec-random",
                                  "gdn.literal-replay.s16a16.long-memory.standard"])
def test_cell_resumed_mid_run_is_bit_identical(cell):
    cfg = SweepConfig(families=(cell.split(".")[0],), modes=(cell.split(".")[2],),
                      schedules=(cell.split(".")[4],), tokens=192, rows=2)
    spec = next(c for c in cfg.cells()[0] if c.id == cell)
    whole = CellRun(spec, cfg, chunk=16)
    while not whole.done:
        whole.run_steps(16)
    first = CellRun(spec, cfg, chunk=16)
    first.run_steps(16 * 5)
    saved = first.state_dict()
    resumed = CellRun(spec, cfg, chunk=16)
    resumed.load_state_dict(saved)
    while not resumed.done:
        resumed.run_steps(16)
    assert json.dumps(resumed.result(), sort_keys=True) == json.dumps(whole.result(), sort_keys=True)


def test_killed_run_resumes_to_identical_reports(reference, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for attempt in range(4):
        out = tmp_path / f"killed{attempt}"
        proc = subprocess.Popen(_cli(*SMALL, "--out", str(out), "--workers", "1"), env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not list(out.glob("*/*")):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.5) / (attempt + 1))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
    else:
        pytest.fail(f"the run finished before every kill (seed {seed})")
    assert not (out / "drift_report.json").exists()
    done = subprocess.run(_cli(*SMALL, "--out", str(out), "--workers", "1"), env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _reports(out) == _reports(reference), f"kill seed {seed}"


@pytest.mark.slow  # 16.7 s of an idle 2-core run, in the drift-runner group's serial chain (2026-12-01)
def test_shards_merge_to_the_unsharded_report(reference, tmp_path):
    procs = [subprocess.Popen(_cli(*SMALL, "--out", str(tmp_path / f"s{i}"), "--shard", f"{i}/2", "--workers", "1"),
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    cfg, cells = load_cells([tmp_path / "s0", tmp_path / "s1"])
    assert [c["id"] for c in cells] == [c.id for c in cfg.cells()[0]]
    assert main(["drift", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m"),
                 "--no-progress"]) == 0
    assert _reports(tmp_path / "m") == _reports(reference)
    with pytest.raises(ValueError, match="no result yet"):
        load_cells([tmp_path / "s0"])


@pytest.mark.slow  # 12.5 s of an idle 2-core run, in the drift-runner group's serial chain (2026-12-01)
def test_worker_processes_give_the_same_report(reference, tmp_path):
    assert main(["drift", *SMALL, "--out", str(tmp_path / "w"), "--workers", "2"]) == 0
    assert _reports(tmp_path / "w") == _reports(reference)


def test_per_step_path_gives_the_same_reports(reference, tmp_path):
    """The sweep through Lockstep.step every step (run_sweep(fast=False)) and the default fast path
    (chunked inputs, deferred checks, one-pass drains): the same cell files and reports, byte for byte."""
    cfg = SweepConfig.from_dict(json.loads((reference / "config.json").read_text()))
    run_sweep(cfg, tmp_path / "slow", progress=False, checkpoint_every_s=0, fast=False)
    for f in sorted((reference / "cells").glob("*.json")):
        assert (tmp_path / "slow" / "cells" / f.name).read_bytes() == f.read_bytes(), f.name
    assert main(["drift", "--merge", str(tmp_path / "slow"), "--out", str(tmp_path / "m"), "--no-progress"]) == 0
    assert _reports(tmp_path / "m") == _reports(reference)


def test_a_cell_out_of_device_memory_is_named_and_reruns_to_the_same_reports(reference, tmp_path, monkeypatch,
                                                                             capsys):
    """A cell that runs out of device memory (too many processes on one card, 2026-12-06 on the H200)
    gets no result while the others run; the report lists it as not run, the command exits 3 naming
    --workers; rerun on the same --out, only that cell runs, and the reports equal the uninterrupted run's."""
    import replayssm.validators.jobs.drift.sweep as D

    cfg = SweepConfig.from_dict(json.loads((reference / "config.json").read_text()))
    victim = cfg.cells()[0][1].id
    real = D.run_cell

    def short_of_memory(cell, *a, **k):
        if cell.id == victim:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
        return real(cell, *a, **k)

    out = tmp_path / "oom"
    monkeypatch.setattr(D, "run_cell", short_of_memory)
    assert main(["drift", *SMALL, "--out", str(out), "--workers", "1"]) == 3
    err = capsys.readouterr().err
    assert f"1 cell(s) ran out of device memory with 1 worker process(es) on cpu ({victim}: OutOfMemoryError" in err
    assert "rerun the same command with fewer --workers" in err
    assert not (out / "cells" / f"{victim}.json").exists()
    assert sorted(p.name for p in (out / "cells").glob("*.json")) == sorted(
        f"{c.id}.json" for c in cfg.cells()[0] if c.id != victim)
    report = (out / "drift_report.md").read_text()
    assert f"- {victim}: ran out of device memory with 1 worker process(es) on cpu" in report
    monkeypatch.setattr(D, "run_cell", real)
    assert main(["drift", *SMALL, "--out", str(out), "--workers", "1"]) == 0
    assert _reports(out) == _reports(reference)


def test_worker_reports_out_of_memory_apart_from_other_errors(reference, tmp_path, monkeypatch):
    """A worker process (run here in-process) sends an out-of-memory cell as ("oom", id, first line),
    which the parent lists, and any other error as ("error", id, traceback), which fails the sweep."""
    import queue

    import replayssm.validators.jobs.drift.sweep as D

    cfg = SweepConfig.from_dict(json.loads((reference / "config.json").read_text()))
    ids = [c.id for c in cfg.cells()[0][:2]]

    def broken(cell, *a, **k):
        if cell.id == ids[0]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB\nmore text")
        raise RuntimeError("a harness bug")

    monkeypatch.setattr(D, "run_cell", broken)
    tasks, events = queue.Queue(), queue.Queue()
    for x in (*ids, None):
        tasks.put(x)
    threads = torch.get_num_threads()
    try:
        D._worker(0, "cpu", cfg.to_dict(), str(tmp_path), tasks, events, 0.0, None, [], os.getppid(), None)
    finally:
        torch.set_num_threads(threads)
    got = [events.get_nowait() for _ in range(events.qsize())]
    assert got[0] == ("oom", ids[0], "OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB")
    assert got[1][:2] == ("error", ids[1]) and "RuntimeError: a harness bug" in got[1][2]
    assert got[2] == ("exit", 0)


@pytest.mark.parametrize("device, selected", [("cuda", []), ("cuda:1", [torch.device("cuda:1")]), ("cpu", [])],
                         ids=["cuda", "cuda1", "cpu"])
def test_worker_selects_an_indexed_device_only(device, selected, tmp_path, monkeypatch):
    """A worker given "cuda" (no index: ``run_sweep(devices=["cuda"])``) keeps the process's current
    device; torch.cuda.set_device refuses a device without an index (a ValueError in every worker)."""
    import queue

    import replayssm.validators.jobs.drift.sweep as D

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    tasks, events = queue.Queue(), queue.Queue()
    tasks.put(None)
    threads = torch.get_num_threads()
    try:
        D._worker(0, device, SweepConfig(tokens=256).to_dict(), str(tmp_path), tasks, events, 0.0, None, [],
                  os.getppid(), None)
    finally:
        torch.set_num_threads(threads)
    assert calls == selected
    assert events.get_nowait() == ("exit", 0)


def test_default_chunk():
    assert [default_chunk("cpu", 2), default_chunk("cuda", 8), default_chunk("cuda", 64), default_chunk("cuda", 3),
            default_chunk("cuda:1", 512), default_chunk("cuda", 8, speculative=True)] == [64, 256, 64, 1024, 64, 64]


def test_dispatch_order_takes_the_speculative_cells_first():
    cells = SweepConfig(tokens=256).cells()[0]
    order = dispatch_order(cells)
    assert sorted(c.id for c in order) == sorted(c.id for c in cells)
    n_spec = sum(c.speculative for c in cells)
    assert 0 < n_spec < len(cells)
    assert all(c.speculative for c in order[:n_spec]) and not any(c.speculative for c in order[n_spec:])
    assert order[:n_spec] == [c for c in cells if c.speculative]  # each group keeps the configuration's order
    assert order[n_spec:] == [c for c in cells if not c.speculative]


def test_shard_arithmetic():
    cells = SweepConfig(tokens=256).cells()[0]
    parts = [shard_cells(cells, (i, 3)) for i in range(3)]
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cells)
    assert parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "a/b", "1", "-1/2"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
