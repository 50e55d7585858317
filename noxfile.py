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


@nox.session(venv_params=VENV)
def tests_slow(session):
    """The slow CPU tier (marker slow, no CUDA): longer variants of tests the quick run keeps one of;
    nightly, so ``./dev test`` stays under ten minutes on two cores."""
    _install(session)
    session.run("python", "-m", "pytest", "-q", "-m", "slow and not gpu and not bench", *session.posargs,
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


# The parts of the benchmark suite: JSON name -> test module.  The regression gate of `nox -s bench
# -- --baseline DIR` is `replayssm results gate` on the two runs' records (its thresholds per part are
# replayssm/records/gate.py THRESHOLDS, with the measurement they come from).
BENCH_PARTS = {
    "kernels": "tests/bench/test_bench_kernels.py",
    "suite": "tests/bench/test_bench_suite_speed.py",
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
    e.g. main's): then ``replayssm results gate`` reads both runs as records and fails when a
    benchmark's median is slower than the baseline's by more than its part's threshold.  A failure in
    one part still runs the other."""
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
    for name, module in BENCH_PARTS.items():
        cmd = ["python", "-m", "pytest", module, "-q", "-m", "bench", "-p", "no:xdist", "-p", "no:cacheprovider",
               "--benchmark-only", "--benchmark-columns=min,median,iqr,rounds", "--benchmark-sort=name",
               f"--benchmark-json={opts['out']}/{name}.json"]
        try:
            session.run(*cmd, *rest, env=env)
        except nox.command.CommandFailed:
            failed.append(name)
    if opts["baseline"] is not None:
        runs = [f"{d}/{name}.json" for d in (opts["baseline"], opts["out"]) for name in BENCH_PARTS
                if Path(d, f"{name}.json").is_file()]
        try:
            session.run("python", "-m", "replayssm", "results", "gate", opts["baseline"], opts["out"], "--by", "source",
                        *[a for run in runs for a in ("--ledger", run)], env=env)
        except nox.command.CommandFailed:
            failed.append("gate")
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
