"""``replayssm results``: latest, compare, gate and page on an in-memory SQLite index of records.

Oracle: a ledger written here from known numbers (two commits x two GPUs; timings, drift bits,
verdicts): ``latest`` must pick the newest per case and device, ``compare`` must divide the two
sides' metrics, the gate must pass a same-speed pair and fail the slowed kernel's cases only (the
logic of the former tools/bench_gate_report.py; ``nox -s bench -- --baseline`` decides through it),
the page must show every verdict row escaped, byte-identical on a second render, and a real headless
Chromium must read its rows back.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from replayssm import cli
from replayssm.records import Recorder, append
from replayssm.records.gate import THRESHOLDS, compare, from_pytest_benchmark
from replayssm.records.index import Index
from replayssm.validators.jobs.results_page import page

ROOT = Path(__file__).resolve().parents[2]
GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
COMMITS = ("aaaaaaa11111", "bbbbbbb22222")
VERSIONS = {"python": "3.11", "torch": "2.9", "triton": "3.5", "replayssm": "0.1.0"}


def recorder(job, commit, gpu):
    return Recorder(job, commit=commit, dirty=False, device_info_={"kind": "cuda", "name": gpu, "driver": "570.1"},
                    versions_=VERSIONS)


def us_of(commit, gpu, kernel, slow=1.0):
    base = {"triton-baseline": 20.0, "triton-replay": 10.0}[kernel] * (1.5 if gpu == GPUS[0] else 1.0)
    return base * (1.02 if commit == COMMITS[1] else 1.0) * slow


def ledger(tmp_path, slowed: str | None = None) -> Path:
    path = tmp_path / "ledger.jsonl"
    recs = []
    for i, commit in enumerate(COMMITS):
        for gpu in GPUS:
            created = f"2026-12-0{i + 1}T00:00:00Z"
            for kernel in ("triton-baseline", "triton-replay"):
                slow = 1.5 if commit == COMMITS[1] and kernel == slowed else 1.0
                recs.append(recorder("bench", commit, gpu).record(
                    f"mamba2/{kernel}/s32a16/nano4b/standard-L16/b128", created=created, verdict="none",
                    metrics={"us": us_of(commit, gpu, kernel, slow), "tbps": 1.0}, family="mamba2", kernel=kernel))
            recs.append(recorder("drift", commit, gpu).record(
                "mamba2/triton-replay/s16a16/nano4b/mild/standard", created=created, verdict="pass",
                metrics={"state_bits_eff": 10.5 + i, "output_bits_eff": 9.0, "state_bits_declared": 11.0},
                kernel="triton-replay"))
            recs.append(recorder("validate", commit, gpu).record(
                "mamba2/vllm-replay/s32a16/nano4b/exhaustive", created=created, kernel="vllm-replay",
                verdict="fail" if i == 1 else "pass", reason="<b>output</b> at step 3" if i == 1 else None,
                metrics={"tokens_per_s": 1000.0 + i, "failures": i}))
            recs.append(recorder("validate", commit, gpu).record(
                "mamba2/triton-replay/s32a16/nano4b/exhaustive", created=created, kernel="triton-replay",
                verdict="pass", metrics={"tokens_per_s": 2000.0, "failures": 0}))
    append(path, recs)
    return path


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_latest_is_the_newest_record_per_case_and_device(capsys, tmp_path):
    path = ledger(tmp_path)
    code, out, _ = run(capsys, "results", "latest", "--ledger", path, "--json")
    assert code == 0
    rows = [json.loads(x) for x in out.splitlines()]
    assert len(rows) == 5 * len(GPUS)  # five cases on each GPU
    assert {r["commit_id"] for r in rows} == {COMMITS[1]}
    vllm = [r for r in rows if r["case_id"].startswith("mamba2/vllm-replay")]
    assert all(r["verdict"] == "fail" and r["metrics"]["failures"] == 1 for r in vllm)


def test_compare_two_devices_divides_their_metrics(capsys, tmp_path):
    path = ledger(tmp_path)
    code, out, _ = run(capsys, "results", "compare", "H100", "H200", "--by", "device", "--job", "bench",
                       "--ledger", path)
    assert code == 0
    row = next(x for x in out.splitlines() if "triton-replay/s32a16/nano4b/standard" in x and COMMITS[0] in x
               and "| us |" in x)
    assert row.split("|")[-2].strip() == f"{1 / 1.5:.3f}"


def test_compare_two_commits_shows_a_changed_verdict(capsys, tmp_path):
    code, out, _ = run(capsys, "results", "compare", COMMITS[0][:7], COMMITS[1][:7], "--ledger", ledger(tmp_path))
    assert code == 0 and re.search(r"vllm-replay.*\| verdict \| pass \| fail \|", out)


def test_compare_names_an_unknown_side(capsys, tmp_path):
    code, _, err = run(capsys, "results", "compare", "ccccccc", COMMITS[0], "--ledger", ledger(tmp_path))
    assert code == 2 and "no record of commit 'ccccccc'" in err


def test_the_gate_passes_the_same_speed_and_fails_the_slowed_kernel_only(capsys, tmp_path):
    code, out, _ = run(capsys, "results", "gate", COMMITS[0][:7], COMMITS[1][:7], "--ledger", ledger(tmp_path))
    assert code == 0 and "**gate PASS**" in out  # +2 % on every case: within the kernels' 5 %
    slow_dir = tmp_path / "slow"
    slow_dir.mkdir()
    code, out, _ = run(capsys, "results", "gate", COMMITS[0][:7], COMMITS[1][:7],
                       "--ledger", ledger(slow_dir, slowed="triton-replay"))
    assert code == 1 and "**gate FAIL**" in out
    over = re.findall(r"\| ([^|]+?) \| [^|]+ \| [^|]+ \| \+[\d.]+ % \*\*over\*\*", out)
    assert len(over) == len(GPUS) and all("/triton-replay/" in name for name in over)
    code, out, _ = run(capsys, "results", "gate", COMMITS[0][:7], COMMITS[1][:7], "--threshold", "kernels=60",
                       "--ledger", ledger(slow_dir, slowed="triton-replay"))
    assert code == 0


def test_a_bad_threshold_is_refused_naming_the_flag(capsys, tmp_path):
    code, _, err = run(capsys, "results", "gate", "a", "b", "--threshold", "kernel=5", "--ledger", ledger(tmp_path))
    assert code == 2 and "--threshold" in err


def test_nox_bench_gates_through_results_gate(tmp_path, monkeypatch):
    """``nox -s bench -- --gate --baseline DIR``: pytest-benchmark only writes the runs; the decision is
    ``replayssm results gate`` on the two folders' records (no threshold of its own in the noxfile)."""
    from nox.command import CommandFailed

    import noxfile

    base, out = tmp_path / "main", tmp_path / "new"
    for d in (base, out):
        d.mkdir()
        for name in noxfile.BENCH_PARTS:
            (d / f"{name}.json").write_text("{}")
    calls = []

    class Session:
        posargs = ["--gate", "--out", str(out), "--baseline", str(base)]

        def run(self, *args, **kw):
            calls.append(args)
            if kw.get("silent"):
                return "1"  # a CUDA device is visible
            if args[:5] == ("python", "-m", "replayssm", "results", "gate"):
                raise CommandFailed("slower")

        def install(self, *args):
            pass

        def create_tmp(self):
            return str(tmp_path)

        def error(self, msg):
            raise RuntimeError(msg)

    monkeypatch.chdir(ROOT)
    with pytest.raises(RuntimeError, match="gate"):
        noxfile.bench.func(Session())
    pytest_runs = [c for c in calls if c[:3] == ("python", "-m", "pytest")]
    assert len(pytest_runs) == 2 and not any("compare" in a for c in pytest_runs for a in c)
    gate = calls[-1]
    assert gate[:9] == ("python", "-m", "replayssm", "results", "gate", str(base), str(out), "--by", "source")
    assert [gate[i + 1] for i, a in enumerate(gate) if a == "--ledger"] == [
        f"{d}/{n}.json" for d in (base, out) for n in noxfile.BENCH_PARTS]
    assert not re.search(r"THRESHOLD_PCT\s*=", (ROOT / "noxfile.py").read_text())
    assert THRESHOLDS == {"kernels": 5.0, "suite": 63.0}  # rec:03c87d1ae72464e2, rec:aa199ad1422fd1c1


def test_two_runs_of_one_commit_are_gated_by_their_folders(capsys, tmp_path):
    """``--by source``: the sides are the files under two folders (one commit, one device: the
    bench-gate profile's runs A and B, or C slowed)."""
    names = ("test_kernel[triton-baseline]", "test_kernel[triton-replay]")
    for side, medians in (("a", (20e-6, 10e-6)), ("b", (20.1e-6, 10.05e-6)), ("c", (20e-6, 14e-6))):
        (tmp_path / side).mkdir()
        (tmp_path / side / "kernels.json").write_text(json.dumps(_pytest_benchmark_run(dict(zip(names, medians)))))
    ledgers = [a for s in "abc" for a in ("--ledger", tmp_path / s / "kernels.json")]
    code, out, _ = run(capsys, "results", "gate", tmp_path / "a", tmp_path / "b", "--by", "source", *ledgers)
    assert code == 0 and "2 compared" in out and "**gate PASS**" in out
    code, out, _ = run(capsys, "results", "gate", tmp_path / "a", tmp_path / "c", "--by", "source", *ledgers)
    assert code == 1 and "test_kernel[triton-replay] |" in out and "test_kernel[triton-baseline] |" in out
    assert re.findall(r"\| (test_kernel\[[a-z-]+\]) \|[^\n]*\*\*over\*\*", out) == [names[1]]
    code, _, err = run(capsys, "results", "gate", tmp_path / "a", tmp_path / "none", "--by", "source", *ledgers)
    assert code == 2 and "no record of source" in err


def _pytest_benchmark_run(medians: dict[str, float], commit="abc1234def56") -> dict:
    """The fields of a pytest-benchmark JSON that the gate reads (a run as ``--benchmark-json`` saves it)."""
    benches = []
    for name, med in medians.items():
        kernel = name.split("[")[1].rstrip("]")
        benches.append({"fullname": f"tests/bench/test_bench_kernels.py::{name}", "group": "g",
                        "params": {"kernel": kernel}, "stats": {"median": med, "iqr": med / 100, "rounds": 20},
                        "extra_info": {"case": f"mamba2-{kernel}-std-L16-b128", "family": "mamba2", "kernel": kernel,
                                       "mode": "s32a16", "geometry": "nano4b", "gpu": "NVIDIA H200",
                                       "median_us": med * 1e6}})
    return {"benchmarks": benches, "commit_info": {"id": commit, "dirty": False},
            "machine_info": {"python_version": "3.11.7"}, "datetime": "2026-12-01T10:00:00.000000+00:00"}


def test_a_pytest_benchmark_run_is_read_as_records_by_the_gate(capsys, tmp_path):
    names = ("test_kernel[triton-baseline]", "test_kernel[triton-replay]")
    a = _pytest_benchmark_run(dict(zip(names, (20e-6, 10e-6))))
    b = _pytest_benchmark_run(dict(zip(names, (20e-6, 15e-6))), commit="fedcba987654")
    _, summary = compare(from_pytest_benchmark(a), from_pytest_benchmark(b), 5)
    assert summary["compared"] == 2 and summary["over"] == [names[1]]
    assert summary["worst_slowdown"] == pytest.approx(50.0)
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    code, out, _ = run(capsys, "results", "gate", "abc1234", "fedcba9", "--ledger", pa, "--ledger", pb)
    assert code == 1 and "test_kernel[triton-replay]" in out


def test_a_missing_ledger_is_refused_naming_the_flag(capsys, tmp_path):
    code, _, err = run(capsys, "results", "latest", "--ledger", tmp_path / "none.jsonl")
    assert code == 2 and "--ledger" in err


def test_the_page_is_deterministic_and_escapes_what_records_say(tmp_path):
    path = ledger(tmp_path)
    from replayssm.records import load
    html = page(Index(load(path)))
    assert html == page(Index(reversed(load(path))))
    assert "&lt;b&gt;output&lt;/b&gt; at step 3" in html and "<b>output</b>" not in html
    assert html.count('class="verdict-row"') == 3 * len(GPUS) and html.count("<svg") == 2 * len(GPUS)
    assert "ours pass" in html  # the vllm verdicts count: our replay passed the same case


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_the_page_renders_in_headless_chromium(capsys, tmp_path):
    out = tmp_path / "page.html"
    code, _, err = run(capsys, "results", "page", out, "--ledger", ledger(tmp_path))
    assert code == 0, err
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    rows = re.findall(r'<tr class="verdict-row" data-case="([^"]+)">(.*?)</tr>', dom, re.S)
    assert len(rows) == 3 * len(GPUS)
    verdicts = {(case, re.search(r'<td class="(pass|fail)">', body).group(1)) for case, body in rows}
    assert ("mamba2/vllm-replay/s32a16/nano4b/exhaustive", "fail") in verdicts
    assert ("mamba2/triton-replay/s16a16/nano4b/mild/standard", "pass") in verdicts
    assert dom.count('class="time-row"') == 8 and dom.count("<svg") == 2 * len(GPUS)
