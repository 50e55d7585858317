"""nox sessions: tests (CPU, Triton interpreter), gpu (CUDA-marked tests), lint, bench (the GPU
benchmark suite and its regression gate, docs/benchmarks.md), and the validation jobs (drift, fuzz)
that later sections of the README describe.

Sessions reuse the interpreter's site-packages so a GPU runner's preinstalled torch/triton are
kept; everything else is installed from pyproject.toml.
"""

import os
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
VENV = ["--system-site-packages"]


CONSTRAINTS = Path("constraints/test.txt")  # the versions CI runs


def _install(session):
    """``.[dev]`` with the pins of constraints/test.txt, less its torch section (the runner's torch is kept)."""
    text = CONSTRAINTS.read_text()
    pins = Path(session.create_tmp(), "constraints.txt")
    pins.write_text(text[:text.index("# ---- torch")])
    session.install("-c", str(pins), "-e", ".[dev]")


def _has_cuda(session) -> bool:
    out = session.run("python", "-c", "import torch; print(int(torch.cuda.is_available()))", silent=True)
    return out.strip().endswith("1")


@nox.session(venv_params=VENV)
def tests(session):
    """The CPU test suite; Triton kernels run through TRITON_INTERPRET=1."""
    _install(session)
    session.run("python", "-m", "pytest", "-q", "-m", "not slow and not gpu", *session.posargs,
                env={"TRITON_INTERPRET": "1"})


def _gpu_tests(session, marker: str) -> None:
    # pytest-xdist workers share the one GPU (tests/gpu_tiers.py: the big-memory tests run one at a time)
    workers = os.environ.get("REPLAYSSM_GPU_WORKERS", "4")
    if not workers.isdigit():
        session.error(f"REPLAYSSM_GPU_WORKERS={workers!r}: expected a whole number of pytest-xdist workers "
                      "(0 or 1: one process)")
    _install(session)
    if not _has_cuda(session):
        session.skip(f"no CUDA device visible: the {session.name} session needs an NVIDIA GPU "
                     "(set CUDA_VISIBLE_DEVICES)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    xdist = ["-n", workers, "--dist", "loadgroup"] if int(workers) > 1 else []
    session.run("python", "-m", "pytest", "-q", "-m", marker, *xdist, *session.posargs, env=env)


@nox.session(venv_params=VENV)
def gpu(session):
    """The merge tier of the GPU-marked tests (tests/gpu_tiers.py) on a CUDA machine; skips with a
    message without one."""
    _gpu_tests(session, "gpu and not slow and not bench")


@nox.session(venv_params=VENV)
def gpu_slow(session):
    """The slow GPU tier (the other modes, batch sizes, buffers, geometries); shards with
    pytest-split: ``nox -s gpu_slow -- --splits 4 --group 1`` (by ``.test_durations`` when present)."""
    _gpu_tests(session, "gpu and slow and not bench")


# The regression gate of `nox -s bench -- --baseline DIR`: a benchmark fails when its median is more
# than this many percent slower than the baseline's (pytest-benchmark --benchmark-compare-fail takes
# whole percents).  Chosen from the run-to-run noise measured by the bench-gate profile on one H200
# (records rec:03c87d1ae72464e2 and rec:aa199ad1422fd1c1 of docs/reports/ledger.jsonl): 3 x the worst change
# between two runs of one commit, and never below 5.
KERNEL_THRESHOLD_PCT = 5  # kernel cases (CUDA-graph replays): worst same-commit change 0.15 % over 18 cases
SUITE_THRESHOLD_PCT = 63  # the suite's speed (host-bound drift chunks): worst same-commit change 20.9 %, IQR to 58 %
BENCH_PARTS = {  # JSON name -> (test module, threshold)
    "kernels": ("tests/bench/test_bench_kernels.py", KERNEL_THRESHOLD_PCT),
    "suite": ("tests/bench/test_bench_suite_speed.py", SUITE_THRESHOLD_PCT),
}


def _bench_args(posargs: list[str]) -> tuple[dict, list[str]]:
    opts = {"out": "out/bench", "baseline": None, "gate": False}
    rest, args = [], list(posargs)
    while args:
        a = args.pop(0)
        if a == "--gate":
            opts["gate"] = True
        elif a in ("--out", "--baseline"):
            if not args:
                raise ValueError(f"nox -s bench: {a} expects a directory")
            opts[a[2:]] = args.pop(0)
        else:
            rest.append(a)
    if opts["baseline"] is not None:
        missing = [str(Path(opts["baseline"], f"{n}.json")) for n in BENCH_PARTS
                   if not Path(opts["baseline"], f"{n}.json").is_file()]
        if missing:
            raise ValueError(f"nox -s bench: --baseline expects a directory written by nox -s bench (kernels.json, "
                             f"suite.json); missing {missing}")
    return opts, rest


@nox.session(venv_params=VENV)
def bench(session):
    """The GPU benchmark suite (tests/bench) through pytest-benchmark; skips with a message without a GPU.

    ``nox -s bench -- [--gate] [--out DIR] [--baseline DIR] [pytest args]``: writes DIR/kernels.json
    (kernel cases) and DIR/suite.json (the suite's own speed), default DIR out/bench.  ``--gate``: the
    gate's subset of cases (REPLAYSSM_BENCH_GATE=1).  ``--baseline DIR`` (the DIR of an earlier run,
    e.g. main's): compare against it and fail when a benchmark's median is slower by more than
    KERNEL_THRESHOLD_PCT / SUITE_THRESHOLD_PCT.  A failure in one part still runs the other."""
    try:
        opts, rest = _bench_args(list(session.posargs))
    except ValueError as e:
        session.error(str(e))
    _install(session)
    if not _has_cuda(session):
        session.skip("no CUDA device visible: the bench session needs an NVIDIA GPU (set CUDA_VISIBLE_DEVICES)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if opts["gate"]:
        env["REPLAYSSM_BENCH_GATE"] = "1"
    Path(opts["out"]).mkdir(parents=True, exist_ok=True)
    failed = []
    for name, (module, threshold) in BENCH_PARTS.items():
        cmd = ["python", "-m", "pytest", module, "-q", "-m", "bench", "-p", "no:xdist", "-p", "no:cacheprovider",
               "--benchmark-only", "--benchmark-columns=min,median,iqr,rounds", "--benchmark-sort=name",
               f"--benchmark-json={opts['out']}/{name}.json"]
        if opts["baseline"] is not None:
            cmd += [f"--benchmark-compare={opts['baseline']}/{name}.json",
                    f"--benchmark-compare-fail=median:{threshold}%"]
        try:
            session.run(*cmd, *rest, env=env)
        except nox.command.CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"bench: {', '.join(failed)} failed (a failing case, or slower than the baseline beyond "
                      f"the threshold: see the comparison above)")


@nox.session(venv_params=VENV)
def lint(session):
    """ruff over the whole tree."""
    session.install("-c", str(CONSTRAINTS), "ruff")
    session.run("ruff", "check", ".")


@nox.session(venv_params=VENV)
def drift(session):
    """The drift CPU default with --check: fails when a kernel exceeds its budget in
    golden/tolerances.toml (reports in out/drift-check/; extra arguments go to replayssm drift)."""
    _install(session)
    session.run("python", "-m", "replayssm", "drift", "--check", "--no-progress", "--out", "out/drift-check",
                *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(venv_params=VENV)
def fuzz(session):
    """Fuzz every registered kernel for a time budget: ``nox -s fuzz -- [BUDGET_S] [cpu|cuda[:N]]``
    (default 600 s, the GPU when one is visible, profile $REPLAYSSM_FUZZ_PROFILE or nightly).
    Shrunk failures land in failures/ (replay: replayssm validate --scenario FILE)."""
    _install(session)
    args = list(session.posargs)
    budget = args.pop(0) if args and args[0].replace(".", "", 1).isdigit() else "600"
    if args and args[0].startswith(("cpu", "cuda")):
        device = args.pop(0)
    else:
        device = "cuda" if _has_cuda(session) else "cpu"
    env = ({k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} if device.startswith("cuda")
           else {"TRITON_INTERPRET": "1"})
    session.run("python", "-m", "replayssm", "fuzz", "--budget-s", budget, "--device", device,
                "--profile", os.environ.get("REPLAYSSM_FUZZ_PROFILE", "nightly"), "--json", "out/fuzz/report.json",
                *args, env=env)


@nox.session(venv_params=VENV)
def sanitize(session):
    """Our Triton kernels (or ``-- FAMILY:KERNEL ...``) each through one small validate under
    compute-sanitizer initcheck and memcheck, caching allocator off (tools/sanitize.py); GPU only,
    writes out/sanitize/summary.json."""
    _install(session)
    if not _has_cuda(session):
        session.skip("no CUDA device visible: the sanitize session needs an NVIDIA GPU and compute-sanitizer")
    session.run("python", "tools/sanitize.py", *session.posargs)
