"""Drift runs: long lock-step runs of kernels x precision modes x scenarios against fp64.

Oracle: :class:`replayssm.validators.engine.runner.Lockstep` (the fp64, non-speculative, token-by-token
reference of docs/validation.md on the accepted stream).  On top of it a drift cell records, per row:

* ``output``: ``||out - ref||_2 / ||ref||_2`` of every accepted token, at its position in the
  row's accepted stream (speculative runs: window positions ``s < k``);
* ``draft``: the same for rejected draft positions (speculative runs);
* ``state``: the relative error of the checkpoint at every flush (against the reference at the
  folded token count) and of the committed state at log-spaced positions;
* ``flush``: the checkpoint error against the flush count, and ``flush_local``: the error one
  flush injects -- the checkpoint against the fp64 fold of the kernel's *own* previous checkpoint
  over the same tokens (a "shadow" fp64 state re-seeded at every ``local_every``-th flush);
* per-row geometric-mean output error over ``blocks`` equal blocks of positions (for the
  speculative vs standard test).

Curves are streamed into log-binned accumulators (:class:`BinnedCurve`), so a cell of 10^6
tokens keeps kilobytes.  A cell is a pure function of its definition: the same cell gives the
same bits in any process, shard or order (one intra-op thread per process on CPU).

Interruption: each cell checkpoints (kernel snapshot, reference state, shadow, accumulators) at
chunk boundaries, atomically, in a format that cannot execute code with a SHA-256 digest
(:mod:`replayssm.validators.engine.checkpoint_file`); a killed run resumes to bit-identical cell results, and
a checkpoint that is foreign (an older pickle included), truncated or fails its digest is moved to
``<out>/quarantine/`` with one line on stderr and its cell recomputed.  Sharding:
``shard = (i, n)`` takes shard i of n cells balanced by estimated cost (:mod:`replayssm.validators.jobs.scaleout`,
which also holds claim mode and the Ray backend); ``workers`` processes (one per
visible GPU by default on CUDA) share the shard's cells.  Reports are built from the union of
cell files (:mod:`replayssm.validators.jobs.drift.report`), so a merged sharded run equals an
unsharded one.

The job's modules, cut along these seams: :mod:`.cells` (the configuration, the cells, static shards),
:mod:`.cell_run` (one cell's run and its checkpoints), :mod:`.store` (the output folder's files),
:mod:`.provenance` (what makes a stored cell reusable) and this one (the scheduler: workers, resume,
the sweep and the merge of cell files).
"""

from __future__ import annotations

import json
import os
import queue
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from replayssm.validators.engine import checkpoint_file
from replayssm.validators.jobs.drift.cell_run import CellRun, default_chunk
from replayssm.validators.jobs.drift.cells import (
    CellSpec,
    SweepConfig,
    import_kernel_modules,
    kernel_modules,
    shard_cells,
)
from replayssm.validators.jobs.drift.provenance import _history, cell_provenance, reusable
from replayssm.validators.jobs.drift.store import _read_json, _set_aside, atomic_write, cell_path, ckpt_path


def _resume(run: CellRun, spec: CellSpec, cfg: SweepConfig, out: Path, prov: dict, device, chunk: int,
            fast: bool) -> CellRun:
    """``run`` resumed from the cell's checkpoint when one of this provenance is there and usable;
    a checkpoint that is foreign (an older pickled ``.pt`` included), truncated, corrupted, fails its
    digest or does not fit the cell is set aside (:func:`_set_aside`) and a fresh run returned."""
    legacy = out / "checkpoints" / f"{spec.id}.pt"
    if legacy.exists():
        _set_aside(out, legacy, spec, "an older checkpoint format (a pickle, never loaded)")
    cp = ckpt_path(out, spec.id)
    if not (cp.exists() and run.can_checkpoint):
        return run
    try:
        ck = checkpoint_file.read(cp)
        if not isinstance(ck, dict):
            raise checkpoint_file.CheckpointError("corrupted: not a cell checkpoint")
    except checkpoint_file.CheckpointError as e:
        _set_aside(out, cp, spec, str(e))
        return run
    if ck.pop("provenance", None) != prov:  # a checkpoint of other code or versions is not resumed
        return run
    try:
        run.load_state_dict(ck)
    except Exception as e:  # noqa: BLE001 - any misfit (its digest held: written by other code) sets it aside
        _set_aside(out, cp, spec, f"does not fit the cell ({type(e).__name__}: {e})")
        return CellRun(spec, cfg, device, chunk, fast=fast)
    return run


def run_cell(spec: CellSpec, cfg: SweepConfig, out: Path, device="cpu", checkpoint_every_s: float = 30.0,
             chunk: int | None = None, on_progress=None, deadline: float | None = None, fast: bool = True) -> dict:
    """Run (or resume) one cell; writes its result file and returns it (``fast``: see
    :class:`CellRun`; False steps through Lockstep.step, the same results).  ``deadline`` (a
    ``time.time()`` value): stop at the first chunk boundary after it; the result says
    ``truncated`` and how many tokens every row reached (``tokens_run``).  ``on_progress(n, resumed=False)``
    gets the tokens of each stretch run, and once, with ``resumed=True``, those a resumed checkpoint held."""
    out = Path(out)
    chunk = default_chunk(device, cfg.rows, spec.speculative) if chunk is None else chunk
    cp = ckpt_path(out, spec.id)
    prov = cell_provenance(spec, cfg, device)
    history = _history(_read_json(cell_path(out, spec.id)), prov)
    run = _resume(CellRun(spec, cfg, device, chunk, fast=fast), spec, cfg, out, prov, device, chunk, fast)
    if run.step and on_progress:  # the tokens an earlier run validated: the progress bar's, not this run's rate
        on_progress(int(np.minimum(run.pos, cfg.tokens).sum()), True)
    last = time.monotonic()
    while not run.done and run.exception is None:
        if deadline is not None and time.time() >= deadline:
            run.truncated = True
            break
        got = run.run_steps(chunk)
        if on_progress:
            on_progress(got)
        if run.can_checkpoint and not run.done and time.monotonic() - last >= checkpoint_every_s:
            checkpoint_file.write({**run.state_dict(), "provenance": prov}, cp)
            last = time.monotonic()
    if run.truncated and run.can_checkpoint and run.exception is None:
        checkpoint_file.write({**run.state_dict(), "provenance": prov}, cp)  # a cut-short cell resumes from here
    res = {**run.result(), "provenance": prov, "history": history}
    atomic_write(cell_path(out, spec.id), json.dumps(res, sort_keys=True, allow_nan=False) + "\n")
    if cp.exists() and not (run.truncated and run.exception is None):
        cp.unlink()
    return res


def _worker(wid: int, device: str, cfg_dict: dict, out: str, tasks, events, ckpt_s: float, chunk: int | None,
            mods: list, parent: int, deadline: float | None, fast: bool = True) -> None:
    torch.set_num_threads(1)
    if torch.device(device).index is not None:  # "cuda" (no index): the process's current device
        torch.cuda.set_device(torch.device(device))
    import_kernel_modules(mods)
    cfg = SweepConfig.from_dict(cfg_dict)
    by_id = {c.id: c for c in cfg.cells()[0]}

    def progress(n: int, resumed: bool = False) -> None:
        if os.getppid() != parent:  # the parent was killed: stop at this chunk boundary
            raise SystemExit(3)
        events.put(("resumed" if resumed else "tok", n))

    while True:
        cid = tasks.get()
        if cid is None:
            break
        oom = None
        try:
            if deadline is None or time.time() < deadline:
                run_cell(by_id[cid], cfg, Path(out), device, ckpt_s, chunk, progress, deadline, fast)
            events.put(("done", cid))
        except torch.OutOfMemoryError as e:  # the device's memory, not the cell: the parent names the remedy
            oom = _first_line(e)
        except Exception:  # noqa: BLE001 - reported to the parent, which fails the run
            events.put(("error", cid, traceback.format_exc()))
        if oom is not None:  # outside the handler: the traceback's frames, which held the cell's tensors, are gone
            _release_device_memory(device)
            events.put(("oom", cid, oom))
    events.put(("exit", wid))


def dispatch_order(cells: list[CellSpec]) -> list[CellSpec]:
    """The order worker processes take ``cells`` in: the speculative schedules' first, each group in the
    configuration's order.  On a GPU a speculative cell takes about 2.5x a standard one's time (alone on
    an H100, 8 rows: 18,090-18,966 against 45,246-48,696 validated tokens/s, rec:8c86bd2733d4d900,
    rec:670d3bcc7ed69522, rec:ef02ae3dceb5fa92, rec:87ef5234ff23deec of docs/reports/ledger.jsonl); taken
    last, they left the full report's final minutes to a few processes (its third call, of the same
    commit: 11 cells, 20,211 tokens/s against 34,130 in the first; the whole report rec:bc468fe524d00830).
    No cell's numbers depend on the order."""
    return sorted(cells, key=lambda c: not c.speculative)


def default_devices() -> list[str]:
    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _release_device_memory(device: str) -> None:
    """After a cell ran out of device memory (called once its exception, whose frames held the cell's
    tensors, is gone): hand the cached blocks back so that the next cell, or another process sharing
    the card, can have them."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class SweepOutcome:
    """What a sweep ran: its shard's cells, those with a result now, the wall time and tokens, and
    the cells that ran out of device memory (id -> the error's first line; no result, not run)."""
    cells: list[str]
    ran: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    tokens: int = 0
    out_of_memory: dict[str, str] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def prepare_out(cfg: SweepConfig, out: Path) -> None:
    """Create ``out`` with its ``config.json``, or check an existing one holds the same sweep."""
    cp = out / "config.json"
    text = json.dumps(cfg.to_dict(), sort_keys=True, indent=1) + "\n"
    if not cp.exists() and any(p.is_file() for d in ("cells", "checkpoints") for p in (out / d).glob("*")):
        raise ValueError(f"out: {out} holds drift cells but no config.json, so their configuration cannot be "
                         f"proven; use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    if cp.exists():
        try:
            old = SweepConfig.from_dict(json.loads(cp.read_text()))
        except (ValueError, json.JSONDecodeError) as e:
            raise ValueError(f"out: {cp} is not a drift sweep config ({e}); use another --out") from None
        if old.digest != cfg.digest:
            raise ValueError(f"out: {out} holds a different sweep (config {old.digest}, this one {cfg.digest}); "
                             f"use another --out or delete it")
        return
    atomic_write(cp, text)


def run_sweep(cfg: SweepConfig, out: str | Path, *, shard: tuple[int, int] = (0, 1), workers: int = 1,
              devices: list[str] | None = None, progress: bool = True, checkpoint_every_s: float = 30.0,
              chunk: int | None = None, deadline_s: float | None = None, fast: bool = True) -> SweepOutcome:
    """Run this shard's cells of the sweep that have no result file yet (resuming checkpoints).

    ``workers`` processes share the cells (1: in this process); worker ``w`` uses
    ``devices[w % len(devices)]`` (default: every visible GPU, else the CPU).  ``deadline_s``:
    a wall-clock budget; running cells stop at it (``truncated``), cells not started by then
    are not run (a time-boxed GPU run; such a report is not comparable bit for bit).  A cell that
    runs out of device memory (``torch.OutOfMemoryError``, e.g. too many worker processes sharing a
    card) gets no result and is listed in ``SweepOutcome.out_of_memory``; the others go on.  Any other
    error of a cell fails the sweep (``RuntimeError``) once the workers are done."""
    out = Path(out)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
    devices = devices or default_devices()
    prepare_out(cfg, out)
    cells = shard_cells(cfg.cells()[0], shard, cfg)
    todo = [c for c in cells
            if not reusable(_read_json(cell_path(out, c.id)), cell_provenance(c, cfg, devices[0]), cfg)]
    per_cell = cfg.rows * cfg.tokens
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=per_cell * len(cells), initial=per_cell * (len(cells) - len(todo)), unit="tok",
                   unit_scale=True, desc=f"drift {shard[0]}/{shard[1]}", dynamic_ncols=True, smoothing=0.05)
    t0 = time.perf_counter()
    counted = 0

    def tick(n: int, resumed: bool = False) -> None:
        """``n`` tokens validated (``resumed``: by an earlier run, whose checkpoint a cell resumed: they
        move the bar but are not this run's tokens, so not in its rate)."""
        nonlocal counted
        if not resumed:
            counted += n
        if bar is not None:
            bar.update(n)

    errors, oom = [], {}
    deadline = None if deadline_s is None else time.time() + deadline_s
    threads = torch.get_num_threads()
    try:
        if workers == 1 or len(todo) <= 1:
            torch.set_num_threads(1)
            for c in todo:
                if deadline is None or time.time() < deadline:
                    try:
                        run_cell(c, cfg, out, devices[0], checkpoint_every_s, chunk, tick, deadline, fast)
                    except torch.OutOfMemoryError as e:  # the next cells may fit: go on, report it at the end
                        oom[c.id] = _first_line(e)
                    if c.id in oom:
                        _release_device_memory(devices[0])
        else:
            import multiprocessing as mp
            ctx = mp.get_context("spawn")
            tasks, events = ctx.Queue(), ctx.Queue()
            for c in dispatch_order(todo):
                tasks.put(c.id)
            nw = min(workers, len(todo))
            for _ in range(nw):
                tasks.put(None)
            mods = kernel_modules(cfg)
            procs = [ctx.Process(target=_worker, args=(w, devices[w % len(devices)], cfg.to_dict(), str(out), tasks,
                                                       events, checkpoint_every_s, chunk, mods, os.getpid(),
                                                       deadline, fast),
                                 daemon=True)
                     for w in range(nw)]
            for p in procs:
                p.start()
            alive = nw
            while alive:
                try:
                    ev = events.get(timeout=1.0)
                except queue.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        errors.append(f"a worker process died (exit code {dead[0].exitcode})")
                        break
                    continue
                if ev[0] in ("tok", "resumed"):
                    tick(ev[1], ev[0] == "resumed")
                elif ev[0] == "error":
                    errors.append(f"cell {ev[1]}:\n{ev[2]}")
                elif ev[0] == "oom":
                    oom[ev[1]] = ev[2]
                elif ev[0] == "exit":
                    alive -= 1
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
    finally:
        torch.set_num_threads(threads)
        if bar is not None:
            bar.close()
    if errors:
        raise RuntimeError("drift: " + "\n".join(errors))
    wall = time.perf_counter() - t0
    ran = [c.id for c in todo if cell_path(out, c.id).exists()]
    return SweepOutcome([c.id for c in cells], ran, wall, counted, oom)


def load_cells(dirs: list[str | Path], cfg: SweepConfig | None = None) -> tuple[SweepConfig, list[dict]]:
    """The sweep config and every cell result of ``dirs`` (shard outputs of one sweep).  Raises
    ValueError when the configs differ, a cell is missing, or two shards disagree on a cell."""
    cfgs, cells = [], {}
    for d in dirs:
        d = Path(d)
        cp = d / "config.json"
        if not cp.exists():
            raise ValueError(f"merge: {d} has no config.json (not a drift output folder)")
        cfgs.append(SweepConfig.from_dict(json.loads(cp.read_text())))
        for f in sorted((d / "cells").glob("*.json")):
            text = f.read_text()
            res = json.loads(text)
            if res["id"] in cells and cells[res["id"]][0] != text:
                raise ValueError(f"merge: cell {res['id']} differs between shards")
            cells[res["id"]] = (text, res)
    cfg = cfg or cfgs[0]
    for c in cfgs:
        if c.digest != cfg.digest:
            raise ValueError(f"merge: the folders hold different sweeps ({c.digest} vs {cfg.digest})")
    want = [c.id for c in cfg.cells()[0]]
    missing = [w for w in want if w not in cells]
    if missing:
        raise ValueError(f"merge: {len(missing)} cell(s) have no result yet, e.g. {missing[:3]} "
                         f"(run the missing shards, or resume them)")
    return cfg, [cells[w][1] for w in want]


__all__ = ["SweepOutcome", "default_devices", "dispatch_order", "load_cells", "prepare_out", "run_cell", "run_sweep"]
