"""The Ray backend of ``replayssm fuzz --backend ray`` and ``replayssm bench --backend ray``.

The machinery is the drift backend's (:mod:`.ray_backend`: the cluster joined or started, tasks
pulled dynamically with at most as many in flight as the cluster has slots, Ray's retries of a task
whose worker died, one progress bar); the units of work are each job's own:

* fuzz: one task per kernel (a family's kernel or mutant), the serial run's unit
  (:func:`replayssm.validators.jobs.fuzz.run.fuzz_target`), longest first by
  :func:`replayssm.validators.jobs.fuzz.run.fuzz_cost` (a Triton kernel under the interpreter first), ties in
  the serial order. With a time budget each kernel gets ``budget x slots / kernels`` seconds (at most the time
  left), the serial run's share times the slots. A retried task starts its kernel again (the example database,
  when given, keeps what the dead one found). The reports come back in the serial order and are announced in
  it, each as soon as the ones before it are in: the same lines, JSON and artifacts as the serial run, timings
  aside (the ci profile, or ``--seed`` without a budget, draws the same scenarios).
* bench: one task per row of the table (:func:`replayssm.validators.jobs.bench.run.bench_plan`: one decode
  case x batch, its baseline and replay timed), after one task on a whole card that measures the copy ceiling,
  reads the environment and runs the caller's memory check. Each row's inputs are seeded by its place in the
  table, so a row gets the same inputs in any order. The result is the serial
  :func:`replayssm.validators.jobs.bench.run.bench_family` result: every field equal but the measured times
  and what follows from them (:func:`replayssm.validators.jobs.bench.run.without_timings`). A fraction of a
  card per task (``gpus_per_task`` < 1) time-slices the card between rows timed at once: their times are then
  not those of a card alone; a row task on a card of another model than the copy task's fails.

Oracle: a local cluster on CPU reproduces the serial fuzz output (lines, JSON, artifacts) and the
serial bench result less its timings (tests/jobs/test_scaleout.py).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from replayssm.families import family
from replayssm.guard import EnvironmentProblem
from replayssm.records import git_state
from replayssm.registry import get
from replayssm.validators.jobs.bench import run as B
from replayssm.validators.jobs.drift import sweep as D
from replayssm.validators.jobs.fuzz.run import FuzzReport, fuzz_cost, fuzz_target
from replayssm.validators.jobs.scaleout.ray_backend import MAX_RETRIES, check_gpus_per_task, connect, pull, task_slots


def _modules(classes) -> list[tuple[str, str | None]]:
    """(module, file) of each kernel class, for the workers to import (kernels of ``--import`` files)."""
    out = []
    for cls in classes:
        entry = (cls.__module__, getattr(sys.modules.get(cls.__module__), "__file__", None))
        if entry not in out:
            out.append(entry)
    return out


def _on_card(device: str | None) -> str | None:
    """``device`` inside a Ray task: Ray sets CUDA_VISIBLE_DEVICES to the task's card, so cuda[:N] is cuda:0."""
    return "cuda:0" if device is not None and device.startswith("cuda") else device


def _options(ray, fn, gpu: bool, gpus: float, max_retries: int):
    """``fn`` as a Ray task of one CPU (and ``gpus`` cards when ``gpu``); a CPU task runs Triton
    kernels through the interpreter, on any node."""
    env = {} if gpu else {"runtime_env": {"env_vars": {"TRITON_INTERPRET": "1"}}}
    return ray.remote(fn).options(num_cpus=1, num_gpus=gpus if gpu else 0, max_retries=max_retries,
                                  retry_exceptions=False, **env)


def _bar(total: int, desc: str, unit: str):
    """One progress bar on stderr (shown on a terminal only)."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr, dynamic_ncols=True)


class _InOrder:
    """Hands results to ``announce`` in the order of ``keys``, each as soon as those before it are in."""

    def __init__(self, keys: list, announce) -> None:
        self.keys, self.announce, self.got, self.next = list(keys), announce, {}, 0

    def put(self, key, value) -> None:
        self.got[key] = value
        while self.next < len(self.keys) and self.keys[self.next] in self.got:
            self.announce(self.got[self.keys[self.next]])
            self.next += 1


# ---- fuzz -------------------------------------------------------------------------------------------------

def _fuzz_task(family_name: str, name: str, mods: list, kw: dict) -> FuzzReport:
    """Fuzz one kernel in a Ray worker (:func:`replayssm.validators.jobs.fuzz.run.fuzz_target`); the report
    without the engine results of its marginal examples (they stay in the worker)."""
    D.import_kernel_modules(mods)
    if not str(kw.get("kernel_device") or kw["device"]).startswith("cuda"):
        torch.set_num_threads(1)
    report = fuzz_target(get(name, family_name), **kw)
    for e in report.marginal_examples:
        e.pop("result", None)
    return report


def fuzz_ray(targets: list, *, profile: str, device: str = "cpu", kernel_device: str | None = None,
             failures_dir="failures", seed: int | None = None, max_examples: int | None = None,
             modes: tuple[str, ...] | None = None, strict: bool = False, example_db=None,
             budget_s: float | None = None, address: str | None = None, gpus_per_task: float = 1.0,
             announce=lambda report: None, max_retries: int = MAX_RETRIES) -> list[FuzzReport]:
    """Fuzz ``targets`` (kernel classes, in the serial order) as Ray tasks (module docstring);
    ``announce(report)`` is called in that order.  ``failures_dir`` and ``example_db`` must be
    folders every node sees; the reports name them as given."""
    gpus_per_task = check_gpus_per_task(gpus_per_task, "gpus_per_task")
    ray = connect(address)
    gpu = any(str(d).startswith("cuda") for d in (device, kernel_device) if d is not None)
    slots = task_slots(ray, gpu, gpus_per_task, "--gpus-per-task")
    task = _options(ray, _fuzz_task, gpu, gpus_per_task, max_retries)
    mods = _modules(targets)
    keys = [f"{cls.family}/{cls.name}" for cls in targets]
    t_dev = kernel_device or device
    order = sorted(range(len(targets)), key=lambda i: (-fuzz_cost(targets[i], t_dev), i))
    kw = {"profile": profile, "device": _on_card(device) if gpu else device, "seed": seed,
          "kernel_device": _on_card(kernel_device) if gpu else kernel_device,
          "failures_dir": str(Path(failures_dir).resolve()), "max_examples": max_examples, "modes": modes,
          "strict": strict, "example_db": None if example_db is None else str(Path(example_db).resolve())}
    share = None if budget_s is None else budget_s * slots / len(targets)
    t0 = time.monotonic()

    def job(i: int):
        def args():
            left = None if budget_s is None else max(0.0, min(share, budget_s - (time.monotonic() - t0)))
            return targets[i].family, targets[i].name, mods, {**kw, "share_s": left}
        return keys[i], args

    bar = _bar(len(targets), f"fuzz ray ({profile})", "kernel")
    reports: dict = {}

    def show(report: FuzzReport) -> None:
        for attr in ("artifact", "marginal_artifact"):  # named as given, as the serial run names them
            if getattr(report, attr) is not None:
                setattr(report, attr, Path(failures_dir) / Path(getattr(report, attr)).name)
        bar.clear()
        announce(report)
        bar.refresh()

    ordered = _InOrder(keys, show)

    def done(key, report: FuzzReport) -> None:
        reports[key] = report
        bar.update(1)
        ordered.put(key, report)

    try:
        errors = pull(ray, task, [job(i) for i in order], slots, done)
    finally:
        bar.close()
    if errors:
        raise RuntimeError("fuzz: " + "\n".join(f"kernel {e}" for e in errors))
    return [reports[k] for k in keys]


# ---- bench ------------------------------------------------------------------------------------------------

def _bench_env_task(device: str, copy: dict | None, preflight) -> dict:
    """On a whole card (or the CPU): the caller's ``preflight`` check (an EnvironmentProblem comes
    back as its line), then the copy ceiling (unless given) and the environment of the run."""
    device = _on_card(device)
    if preflight is not None:
        try:
            preflight()
        except EnvironmentProblem as e:
            return {"problem": str(e)}
    if copy is None:
        copy = B.copy_bandwidth(device)
        if B.device_is_cuda(device):
            torch.cuda.empty_cache()
    return {"problem": None, "copy": copy, "env": B.environment()}


def _bench_row_task(family_name: str, geometry: str, mode: str, item: B.BenchItem, kw: dict, mods: list) -> dict:
    """Time one row in a Ray worker: its BenchRow as a dict, the lines it logged, the card's name."""
    D.import_kernel_modules(mods)
    device = _on_card(kw.pop("device"))
    if not B.device_is_cuda(device):
        torch.set_num_threads(1)
    lines: list[str] = []
    row = B.bench_row(family_name, geometry, mode, item, device=device, log=lines.append, **kw)
    gpu = torch.cuda.get_device_name(device) if B.device_is_cuda(device) else None
    return {"row": asdict(row), "lines": lines, "gpu": gpu}


def bench_family_ray(family_name: str, geometry: str | None = None, mode="s32a16", L=16,
                     batches=(1, 8, 32, 128, 256, 512), spec_batches=(128, 512), window=4, spec_buffer=16,
                     device="cuda", rep_ms=200, sweep=True, seed=0, copy=None, max_sets=64,
                     baseline="triton-baseline", replay="triton-replay", log=print, address: str | None = None,
                     gpus_per_task: float = 1.0, preflight=None, max_retries: int = MAX_RETRIES) -> dict:
    """:func:`..bench.bench_family` with one Ray task per row (module docstring): the same result but
    its timings, the same lines logged in the same order.  ``preflight``: a picklable callable run
    first on a card of the cluster (the CLI's memory check); its EnvironmentProblem is raised here."""
    gpus_per_task = check_gpus_per_task(gpus_per_task, "gpus_per_task")
    geometry = geometry or family(family_name).bench_geometry
    plan = B.bench_plan(family_name, geometry, mode, L, batches, spec_batches, window, spec_buffer)
    ray = connect(address)
    gpu = B.device_is_cuda(device)
    slots = task_slots(ray, gpu, gpus_per_task, "--gpus-per-task")
    first = _options(ray, _bench_env_task, gpu, 1.0, max_retries).remote(device, copy, preflight)
    head = ray.get(first)
    if head["problem"]:
        raise EnvironmentProblem(head["problem"])
    copy, env = head["copy"], head["env"]
    commit, dirty = git_state()  # the code of this process (the CLI, a test) counts too, as in the serial run
    if commit != env["commit"]:
        raise EnvironmentProblem(f"--backend ray: the cluster runs replayssm at commit {env['commit']}, this "
                                 f"process at {commit}: one commit per run")
    env["dirty"] = env["dirty"] or dirty
    log(B.copy_line(copy))
    mods = _modules([get(baseline, family_name), get(replay, family_name)])
    kw = {"copy": copy, "device": device, "rep_ms": rep_ms, "sweep": sweep, "seed": seed, "max_sets": max_sets,
          "baseline": baseline, "replay": replay}
    task = _options(ray, _bench_row_task, gpu, gpus_per_task, max_retries)
    jobs = [(it.index, (family_name, geometry, mode, it, dict(kw), mods))  # the largest batches first
            for it in sorted(plan, key=lambda it: (-it.batch, it.index))]
    bar = _bar(len(plan), f"bench ray {family_name}", "row")
    rows: dict = {}

    def show(got: dict) -> None:
        bar.clear()
        for line in got["lines"]:
            log(line)
        log(B.row_line(B.BenchRow(**got["row"])))
        bar.refresh()

    ordered = _InOrder([it.index for it in plan], show)

    def done(index: int, got: dict) -> None:
        if got["gpu"] != env.get("gpu"):
            raise RuntimeError(f"bench: row {index} ran on a {got['gpu']}, the copy ceiling on a {env.get('gpu')}: "
                               f"one device model per run")
        rows[index] = got["row"]
        bar.update(1)
        ordered.put(index, got)

    try:
        errors = pull(ray, task, jobs, slots, done)
    finally:
        bar.close()
    if errors:
        raise RuntimeError("bench: " + "\n".join(f"row {e}" for e in errors))
    return {"family": family_name, "geometry": geometry, "mode": mode, "L": L, "copy": copy, "env": env,
            "rows": [rows[it.index] for it in plan]}


__all__ = ["bench_family_ray", "fuzz_ray"]
