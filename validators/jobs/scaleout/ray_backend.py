"""The Ray backend of ``replayssm drift --backend ray``: one Ray task per cell.

Each task runs :func:`replayssm.validators.jobs.drift.sweep.run_cell` on its node, so results, checkpoints and
provenance are a serial run's, written into ``--out`` (a folder every node sees: a shared file
system on a multi-node cluster).  Cells are submitted longest first (:func:`..shards.longest_first`)
and pulled dynamically: at most as many tasks in flight as the cluster has slots (GPUs /
``gpus_per_cell``, else CPUs), the next-longest cell submitted as one finishes.  A task whose worker
process dies (killed, node lost) is retried by Ray (``max_retries``) and resumes from the cell's
last checkpoint; an exception raised by a cell is not retried and fails the sweep, as in the serial
run.  The report is built from the cell files, so it is the serial report byte for byte.

Ray is an optional extra (``pip install 'replayssm[ray]'``); :func:`require_ray` says so in one line.
The machinery (:func:`connect`, :func:`task_slots`, :func:`pull`) also runs the fuzz and the bench
(:mod:`.ray_jobs`).

Oracle: a local cluster on CPU reproduces the serial report byte for byte, also after the worker of
a running cell is SIGKILLed (tests/jobs/test_scaleout.py).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from replayssm.guard import EnvironmentProblem
from replayssm.validators.jobs.drift import sweep as D
from replayssm.validators.jobs.scaleout.shards import longest_first

MAX_RETRIES = 3


def require_ray():
    """The ``ray`` module, or ``ImportError`` with one line naming ``--backend ray`` and the extra."""
    try:
        import ray
    except ImportError:
        raise ImportError("--backend ray: Ray is not installed; pip install 'replayssm[ray]' "
                          "(or give --backend local)") from None
    return ray


def _cell_task(cfg_dict: dict, cell_id: str, out: str, device: str, ckpt_s: float, chunk: int | None, mods: list,
               deadline: float | None, fast: bool) -> dict:
    """Run (or resume) one cell in a Ray worker; returns who ran it and the tokens a checkpoint held."""
    import torch

    torch.set_num_threads(1)
    D.import_kernel_modules(mods)
    cfg = D.SweepConfig.from_dict(cfg_dict)
    spec = {c.id: c for c in cfg.cells()[0]}[cell_id]
    if device == "cuda":  # Ray sets CUDA_VISIBLE_DEVICES to the task's GPU(s)
        device = "cuda:0"
    info = {"cell": cell_id, "host": socket.gethostname(), "pid": os.getpid(), "resumed": 0, "tokens": 0}
    runner = Path(out) / "claims" / f"{cell_id}.ray"  # who runs the cell now (provenance; kept after a kill)
    D.atomic_write(runner, f'{{"host": "{info["host"]}", "pid": {info["pid"]}, "time": {time.time()}}}\n')

    def progress(n: int, resumed: bool = False) -> None:
        info["resumed" if resumed else "tokens"] += n

    D.run_cell(spec, cfg, Path(out), device, ckpt_s, chunk, progress, deadline, fast)
    runner.unlink(missing_ok=True)
    return info


@dataclass
class RayOutcome(D.SweepOutcome):
    """A :class:`drift.SweepOutcome` plus, per cell, the tokens it resumed from a checkpoint
    (a cell whose first worker died) and where it ran."""
    resumed: dict = field(default_factory=dict)
    hosts: dict = field(default_factory=dict)


def connect(address: str | None = None):
    """The ``ray`` module, joined to the running Ray session when there is one, else
    ``ray.init(address)`` (None: ``RAY_ADDRESS``, else a local cluster)."""
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    return ray


def task_slots(ray, gpu: bool, gpus_per_task: float, flag: str = "--gpus-per-cell") -> int:
    """How many tasks the cluster runs at once: GPUs / ``gpus_per_task`` for GPU tasks, else its CPUs.
    EnvironmentProblem (exit 3) naming ``flag`` when a GPU task fits no card of the cluster."""
    res = ray.cluster_resources()
    if not gpu:
        return max(1, int(res.get("CPU", 1)))
    slots = int(res.get("GPU", 0) / gpus_per_task)
    if slots < 1:
        raise EnvironmentProblem(f"--backend ray: the cluster has {res.get('GPU', 0):g} GPU(s), fewer than "
                           f"{flag} {gpus_per_task:g}")
    return slots


def check_gpus_per_task(value, name: str = "gpus_per_cell") -> float:
    """``value`` when it is a number > 0 (a fraction packs several tasks on one card); else
    ValueError naming ``name``."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value):
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return float(value)


def pull(ray, task, jobs: list, slots: int, on_done, *, deadline: float | None = None) -> list[str]:
    """Run ``jobs`` (``(key, args)`` pairs, in the order given: longest first) as
    ``task.remote(*args)`` (``args`` a callable: called at submission) with at most ``slots`` in
    flight, the next submitted as one finishes; ``on_done(key, value)`` for each result in
    completion order.  No job is submitted once ``deadline`` (a ``time.time()``) has passed.
    Returns one line per job that raised (its exception, or a task out of retries)."""
    queue_, pending, errors = list(jobs), {}, []
    while queue_ or pending:
        while queue_ and len(pending) < max(1, slots):
            if deadline is not None and time.time() >= deadline:
                queue_.clear()
                break
            key, args = queue_.pop(0)
            pending[task.remote(*(args() if callable(args) else args))] = key
        if not pending:
            break
        done, _ = ray.wait(list(pending), num_returns=1)
        key = pending.pop(done[0])
        try:
            value = ray.get(done[0])
        except Exception as e:  # noqa: BLE001 - a job's exception, or a task out of retries
            errors.append(f"{key}: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e) else ''}")
            continue
        on_done(key, value)
    return errors


def run_ray(cfg: D.SweepConfig, out: str | Path, *, shard: tuple[int, int] = (0, 1), device: str = "cpu",
            address: str | None = None, gpus_per_cell: float = 1.0, progress: bool = True,
            checkpoint_every_s: float = 30.0, chunk: int | None = None, deadline_s: float | None = None,
            fast: bool = True, max_retries: int = MAX_RETRIES) -> RayOutcome:
    """Run the shard's cells that have no reusable result as Ray tasks (module docstring).  Uses the
    running Ray session when there is one, else ``ray.init(address)`` (None: a local cluster)."""
    require_ray()
    gpus_per_cell = check_gpus_per_task(gpus_per_cell)
    out = Path(out).resolve()
    D.prepare_out(cfg, out)
    cells = D.shard_cells(cfg.cells()[0], shard, cfg)
    todo = [c for c in cells
            if not D.reusable(D._read_json(D.cell_path(out, c.id)), D.cell_provenance(c, cfg, device), cfg)]
    ray = connect(address)
    gpu = device.startswith("cuda")
    slots = task_slots(ray, gpu, gpus_per_cell)
    task = ray.remote(_cell_task).options(num_cpus=1, num_gpus=gpus_per_cell if gpu else 0, max_retries=max_retries,
                                         retry_exceptions=False)
    per_cell = cfg.rows * cfg.tokens
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=per_cell * len(cells), initial=per_cell * (len(cells) - len(todo)), unit="tok",
                   unit_scale=True, desc=f"drift ray {shard[0]}/{shard[1]}", dynamic_ncols=True, smoothing=0.05)
    deadline = None if deadline_s is None else time.time() + deadline_s
    mods, cfg_dict = D.kernel_modules(cfg), cfg.to_dict()
    dev = "cuda" if gpu else device
    jobs = [(c.id, (cfg_dict, c.id, str(out), dev, checkpoint_every_s, chunk, mods, deadline, fast))
            for c in longest_first(todo, cfg)]
    t0, outcome = time.perf_counter(), RayOutcome([c.id for c in cells])
    counted = [0]

    def done(cid: str, info: dict) -> None:
        counted[0] += info["tokens"]
        outcome.hosts[cid] = f"{info['host']} pid {info['pid']}"
        if info["resumed"]:
            outcome.resumed[cid] = info["resumed"]
            print(f"replayssm: drift: cell {cid} resumed from its checkpoint at {info['resumed']:,} tokens "
                  f"(a worker died; retried on {info['host']})", file=sys.stderr, flush=True)
        if bar is not None:
            bar.update(info["tokens"] + info["resumed"])

    try:
        errors = pull(ray, task, jobs, slots, done, deadline=deadline)
    finally:
        if bar is not None:
            bar.close()
    if errors:
        raise RuntimeError("drift: " + "\n".join(f"cell {e}" for e in errors))
    outcome.wall_s, outcome.tokens = time.perf_counter() - t0, counted[0]
    outcome.ran = [c.id for c in todo if D.cell_path(out, c.id).exists()]
    return outcome


__all__ = ["MAX_RETRIES", "RayOutcome", "check_gpus_per_task", "connect", "pull", "require_ray", "run_ray",
           "task_slots"]
