"""nox sessions: tests (CPU, Triton interpreter), gpu (CUDA-marked tests), lint, and the
validation jobs (drift, fuzz, bench) that later sections of the README describe.

Sessions reuse the interpreter's site-packages so a GPU runner's preinstalled torch/triton are
kept; everything else is installed from pyproject.toml.
"""

import os

import nox

nox.options.sessions = ["lint", "tests"]
VENV = ["--system-site-packages"]


def _install(session):
    session.install("-e", ".[dev]")


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
def gpu(session):
    """The GPU-marked tests on a CUDA machine; skips with a message without one."""
    _install(session)
    if not _has_cuda(session):
        session.skip("no CUDA device visible: the gpu session needs an NVIDIA GPU (set CUDA_VISIBLE_DEVICES)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    session.run("python", "-m", "pytest", "-q", "-m", "gpu", *session.posargs, env=env)


@nox.session(venv_params=VENV)
def lint(session):
    """ruff over the whole tree."""
    session.install("ruff>=0.5")
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
