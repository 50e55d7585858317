"""Sweeps past one machine (validators/scaleout): drift shards from the environment and balanced by
estimated cost, claim mode on a shared --out, the Ray backend of drift, fuzz and bench on a local cluster.

Every comparison of drift reports is byte equality of the JSON, Markdown and HTML files against the
serial run of the same sweep (as tests/jobs/test_drift_runner.py); fuzz and bench runs are compared with
the serial run's output less its measured times.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from replayssm import cli_fuzz
from replayssm.cli import main
from replayssm.cli_list import load_kernels
from replayssm.validators.jobs.bench.run import TIMING_ROW_FIELDS, bench_family, without_timings
from replayssm.validators.jobs.drift.cells import CellSpec, SweepConfig
from replayssm.validators.jobs.fuzz.run import fuzz_cost, fuzzable_kernels
from replayssm.validators.jobs.scaleout import claims as C
from replayssm.validators.jobs.scaleout import shards as S
from replayssm.validators.jobs.scaleout.ray_jobs import bench_family_ray

TINY = ["--families", "mamba2,gdn", "--modes", "s32a16", "--schedules", "standard,spec-random",
        "--tokens", "256", "--rows", "2", "--no-progress", "--checkpoint-every", "0"]
FILES = ("drift_report.json", "drift_report.md", "drift_report.html")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
pytestmark = pytest.mark.xdist_group("scaleout")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "replayssm", "drift", *args]


def _reports(d: Path) -> dict[str, bytes]:
    return {f: (d / f).read_bytes() for f in FILES}


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scaleout-serial")
    assert main(["drift", *TINY, "--out", str(out), "--workers", "1"]) == 0
    return out


# ---- shards -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env, want", [
    ({"REPLAYSSM_SHARD": "2/4"}, (2, 4)),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "3"}, (0, 3)),
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "3",
      "SLURM_ARRAY_TASK_STEP": "2"}, (1, 4)),
    ({"BUILDKITE_PARALLEL_JOB": "1", "BUILDKITE_PARALLEL_JOB_COUNT": "2"}, (1, 2)),
    ({"REPLAYSSM_SHARD": "1/2", "BUILDKITE_PARALLEL_JOB": "1", "BUILDKITE_PARALLEL_JOB_COUNT": "2"}, (1, 2)),
], ids=["replayssm", "slurm", "slurm-min-step", "buildkite", "agreeing"])
def test_shard_from_env(env, want):
    assert S.shard_from_env(env) == want


@pytest.mark.parametrize("env, needle", [
    ({}, "none of"),
    ({"SLURM_ARRAY_TASK_ID": "1"}, "SLURM_ARRAY_TASK_COUNT is not"),
    ({"BUILDKITE_PARALLEL_JOB": "2", "BUILDKITE_PARALLEL_JOB_COUNT": "2"}, "expected 0 <= i < n"),
    ({"REPLAYSSM_SHARD": "x"}, "not i/n"),
    ({"SLURM_ARRAY_TASK_ID": "a", "SLURM_ARRAY_TASK_COUNT": "2"}, "not an integer"),
    ({"REPLAYSSM_SHARD": "0/2", "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}, "disagrees"),
], ids=["none", "half-pair", "out-of-range", "malformed", "not-integer", "disagree"])
def test_shard_from_env_refusals_name_shard_auto(env, needle):
    with pytest.raises(ValueError, match="--shard auto") as e:
        S.shard_from_env(env)
    assert needle in str(e.value)


def test_bad_shard_auto_fails_before_any_work(tmp_path, capsys, monkeypatch):
    for v in ("REPLAYSSM_SHARD", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "BUILDKITE_PARALLEL_JOB",
              "BUILDKITE_PARALLEL_JOB_COUNT"):
        monkeypatch.delenv(v, raising=False)
    assert main(["drift", *TINY, "--out", str(tmp_path / "o"), "--shard", "auto"]) == 2
    assert "--shard auto" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cost_model_factors():
    cfg = SweepConfig(families=("mamba2",), kernels=("literal-replay", "triton-replay"), tokens=256)
    lit = CellSpec("mamba2", "literal-replay", "s32a16", "long-memory", "standard")
    tri = CellSpec("mamba2", "triton-replay", "s32a16", "long-memory", "standard")
    spec = CellSpec("mamba2", "triton-replay", "s32a16", "long-memory", "spec-random")
    assert S.eager(lit) and not S.eager(tri)
    assert S.cell_cost(lit, cfg) == S.EAGER_FACTOR * S.cell_cost(tri, cfg)
    assert S.cell_cost(spec, cfg) == S.SPECULATIVE_FACTOR * S.cell_cost(tri, cfg)
    assert S.cell_cost(tri, SweepConfig(families=("mamba2",), tokens=512, rows=3)) == 3 * S.cell_cost(tri, cfg)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_balanced_shards_partition_deterministically_within_the_lpt_bound(n):
    cfg = SweepConfig(kernels=("literal-replay", "triton-replay"), tokens=256)
    cells = cfg.cells()[0]
    parts = S.balanced_shards(cells, n, cfg)
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cells)
    assert parts == S.balanced_shards(list(reversed(cells)), n, cfg)  # the cells' order does not matter
    loads = [sum(S.cell_cost(c, cfg) for c in p) for p in parts]
    biggest = max(S.cell_cost(c, cfg) for c in cells)
    assert max(loads) <= sum(loads) / n + biggest
    stride = [cells[i::n] for i in range(n)]  # the old every-n-th shards, for contrast: never better
    assert max(loads) <= max(sum(S.cell_cost(c, cfg) for c in p) for p in stride)


def test_example_workflow_uses_shard_auto():
    text = (Path(__file__).resolve().parents[2] / ".github" / "workflows" / "gpu.yml").read_text()
    assert "--shard auto" in text and "REPLAYSSM_SHARD" in text


# ---- claims -------------------------------------------------------------------------------------------

def _fake_claim(p: Path, host: str, pid: int, age: float) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f'{{"host": "{host}", "pid": {pid}, "token": "t", "heartbeat": {time.time() - age}}}\n')


def test_claims_are_exclusive_and_expired_ones_are_taken_over(tmp_path):
    a = C.try_claim(tmp_path, "cell-a", ttl=30)
    assert a is not None and a.took_over is None
    assert C.try_claim(tmp_path, "cell-a", ttl=30) is None  # held (this live pid)
    assert a.beat() and a.held()
    a.release()
    assert not C.claim_path(tmp_path, "cell-a").exists()
    p = C.claim_path(tmp_path, "cell-b")
    _fake_claim(p, "elsewhere", 1, age=5)
    assert C.try_claim(tmp_path, "cell-b", ttl=30) is None  # another host, fresh heartbeat
    _fake_claim(p, "elsewhere", 1, age=60)
    b = C.try_claim(tmp_path, "cell-b", ttl=30)
    assert b is not None and "heartbeat is 60 s old" in b.took_over and b.held()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _fake_claim(C.claim_path(tmp_path, "cell-c"), socket.gethostname(), dead.pid, age=0)
    c = C.try_claim(tmp_path, "cell-c", ttl=30)
    assert c is not None and f"pid {dead.pid} no longer runs" in c.took_over


def test_a_lost_claim_is_not_refreshed(tmp_path):
    a = C.try_claim(tmp_path, "cell", ttl=30)
    _fake_claim(a.path, "elsewhere", 1, age=0)  # taken over while this holder was late
    assert not a.held() and not a.beat()
    a.release()
    assert C.claim_path(tmp_path, "cell").exists()  # the new holder's claim is left alone


@pytest.mark.slow  # 71.8 s on the shared 2-core machine (three processes importing torch; 2026-12-07)
def test_claim_processes_share_one_out_and_reproduce_the_serial_report(serial, tmp_path):
    out = tmp_path / "shared"
    procs = [subprocess.Popen(_cli(*TINY, "--out", str(out), "--claim"), env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-2000:]
    assert _reports(out) == _reports(serial)
    assert not list((out / "claims").glob("*.claim"))


def test_a_claimant_killed_mid_cell_is_taken_over_and_resumed(serial, tmp_path, capfd):
    out = tmp_path / "shared"
    proc = subprocess.Popen(_cli(*TINY, "--out", str(out), "--claim"), env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and proc.poll() is None and not list(out.glob("checkpoints/*.ckpt")):
        time.sleep(0.02)
    assert proc.poll() is None, "the claimant finished before a checkpoint appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = sorted(p.stem for p in (out / "claims").glob("*.claim"))
    assert left, "the killed claimant left no claim"
    assert main(["drift", *TINY, "--out", str(out), "--claim", "--claim-ttl", "600"]) == 0
    err = capfd.readouterr().err
    assert f"claim on {left[0]} taken over from {socket.gethostname()} pid {proc.pid}" in err
    assert f"cell {left[0]} resumed from its checkpoint" in err
    assert _reports(out) == _reports(serial)


def test_claim_flags_are_refused_before_any_work(tmp_path, capsys):
    for args, needle in ((["--claim", "--shard", "0/2"], "--claim"), (["--claim-ttl", "5"], "--claim-ttl"),
                         (["--ray-address", "x"], "--ray-address"), (["--claim", "--workers", "2"], "--claim")):
        assert main(["drift", *TINY, "--out", str(tmp_path / "o"), *args]) == 2
        assert needle in capsys.readouterr().err
        assert not (tmp_path / "o").exists()


# ---- Ray ----------------------------------------------------------------------------------------------

def test_backend_ray_without_ray_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as when it is not installed
    assert main(["drift", *TINY, "--out", str(tmp_path / "o"), "--backend", "ray"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend ray" in err and "replayssm[ray]" in err
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'replayssm[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_backend_reproduces_the_serial_report_after_a_worker_is_killed(serial, ray_cluster, tmp_path, capfd):
    """A local two-CPU cluster runs the sweep; the worker of the first cell to checkpoint is
    SIGKILLed once; Ray retries its task, which resumes the checkpoint: the serial report, byte for byte."""
    out = tmp_path / "ray"
    killed = {}

    def killer():
        end = time.monotonic() + 300
        while time.monotonic() < end and not killed:
            for ck in out.glob("checkpoints/*.ckpt"):
                run = out / "claims" / f"{ck.name.removesuffix('.ckpt')}.ray"
                try:
                    pid = int(run.read_text().split('"pid": ')[1].split(",")[0])
                except (OSError, IndexError, ValueError):
                    continue
                os.kill(pid, signal.SIGKILL)
                killed[ck.name.removesuffix(".ckpt")] = pid
                return
            time.sleep(0.02)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    assert main(["drift", *TINY, "--out", str(out), "--backend", "ray"]) == 0
    t.join()
    assert killed, "no cell checkpointed while its worker ran"
    (cid,) = killed
    assert f"cell {cid} resumed from its checkpoint" in capfd.readouterr().err
    assert _reports(out) == _reports(serial)


# ---- Ray: the nightly fuzz and the bench ----------------------------------------------------------------------

FUZZ = ["fuzz", "--family", "mamba2", "--kernel", "literal-replay", "--kernel", "mutant-readout-without-skip",
        "--profile", "ci", "--max-examples", "4"]
BENCH_TINY = dict(L=2, batches=(1,), spec_batches=(1,), window=2, spec_buffer=2, device="cpu", sweep=False,
                  copy={"tbps": 1.0, "bytes": 1, "ms": 1.0}, max_sets=2)
TIMED = (r"\d+\.\d s\b", r"\d+ s\b")  # wall times in the fuzz lines
TIMED_BENCH = (r"\s+\d+\.\d+ us", r"\d+\.\d+ TB/s, \d+%", r"ratio \d+\.\d+")  # timings in the bench lines


def _untimed(text: str, patterns=TIMED) -> str:
    for p in patterns:
        text = re.sub(p, "T", text)
    return text


@pytest.mark.parametrize("argv", [FUZZ, ["bench", "--family", "mamba2"]], ids=["fuzz", "bench"])
def test_fuzz_and_bench_backend_ray_without_ray_is_one_line(argv, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as when it is not installed
    assert main([*argv, "--backend", "ray"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend ray" in err and "replayssm[ray]" in err


@pytest.mark.parametrize("argv", [FUZZ, ["bench", "--family", "mamba2"]], ids=["fuzz", "bench"])
@pytest.mark.parametrize("flag", [["--ray-address", "auto"], ["--gpus-per-task", "0.5"]], ids=["address", "gpus"])
def test_ray_flags_only_with_backend_ray(argv, flag, capsys):
    assert main([*argv, *flag]) == 2
    assert f"{flag[0]}: only with --backend ray" in capsys.readouterr().err


@pytest.mark.slow  # (12-16 s on the shared local cluster; drift's Ray test stays in the quick run)
def test_fuzz_backend_ray_reproduces_the_serial_run(ray_cluster, tmp_path, capsys):
    """One task per kernel on the local cluster: the same lines (in the serial order), JSON and shrunk
    reproducer as the serial run, the wall times aside."""
    runs = {}
    for backend in ("local", "ray"):
        d = tmp_path / backend
        code = main([*FUZZ, "--include-mutants", "--failures", str(d / "failures"), "--json", str(d / "report.json"),
                     "--backend", backend])
        assert code == 1  # the mutant is caught
        out = capsys.readouterr().out.replace(str(d), "DIR")
        report = json.loads((d / "report.json").read_text().replace(str(d), "DIR"))
        for r in report:
            r["wall_s"] = r["time_to_first_failure_s"] = None
        artifact = (d / "failures" / "mamba2-mutant-readout-without-skip.json").read_bytes()
        runs[backend] = (_untimed(out), report, artifact)
    assert runs["ray"] == runs["local"]
    assert runs["ray"][0].splitlines()[0].startswith("PASS literal-replay [mamba2]: 4 scenarios")


@pytest.mark.slow  # (12-16 s on the shared local cluster; drift's Ray test stays in the quick run)
def test_bench_backend_ray_reproduces_the_serial_table_less_its_timings(ray_cluster):
    """One task per row of the table on the local cluster: the serial result but for the measured
    times (and the date), the same lines logged in the same order."""
    logs = {"local": [], "ray": []}
    serial = bench_family("mamba2", "tiny", "s32a32", log=logs["local"].append, **BENCH_TINY)
    ray_res = bench_family_ray("mamba2", "tiny", "s32a32", log=logs["ray"].append, **BENCH_TINY)
    assert [r["case"] for r in ray_res["rows"]] == ["standard L=2", "spec T'=2 B=2 all accepted",
                                                    "spec T'=2 B=2 half accepted"]
    assert without_timings(ray_res) == without_timings(serial)
    assert [_untimed(x, TIMED_BENCH) for x in logs["ray"]] == [_untimed(x, TIMED_BENCH) for x in logs["local"]]
    assert all(r[f] > 0 for r in ray_res["rows"] for f in TIMING_ROW_FIELDS)


@pytest.mark.parametrize("n", [2, 3])
def test_fuzz_shards_partition_the_kernels_in_the_serial_order(n):
    load_kernels()
    targets = fuzzable_kernels(include_mutants=True)
    parts = [cli_fuzz._shard(targets, (i, n), "cpu") for i in range(n)]
    assert sorted((c.family, c.name) for p in parts for c in p) == sorted((c.family, c.name) for c in targets)
    assert all(p == [c for c in targets if c in p] for p in parts)  # each shard in the serial order
    interpreted = [sum(fuzz_cost(c, "cpu") > 1 for c in p) for p in parts]
    assert max(interpreted) - min(interpreted) <= 1  # the costly (interpreted Triton) kernels spread evenly


@pytest.mark.parametrize("shard, needle", [("auto", "--shard auto"), ("2/2", "--shard"), ("x", "--shard")],
                         ids=["auto-unset", "out-of-range", "malformed"])
def test_fuzz_bad_shard_fails_before_any_work(shard, needle, tmp_path, capsys, monkeypatch):
    for v in ("REPLAYSSM_SHARD", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "BUILDKITE_PARALLEL_JOB",
              "BUILDKITE_PARALLEL_JOB_COUNT"):
        monkeypatch.delenv(v, raising=False)
    assert main([*FUZZ, "--shard", shard, "--failures", str(tmp_path / "f")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_bench_backend_ray_on_a_cluster_without_gpus_is_one_line(ray_cluster, capsys):
    assert main(["bench", "--family", "mamba2", "--backend", "ray"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "0 GPU(s), fewer than --gpus-per-task 1" in err
