"""Shared fixtures of the test suite, and the thread budget of each test process."""

import os

import pytest
import torch


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def pytest_configure(config):
    """Under pytest-xdist each worker gets its share of the cores (two workers on a 2-core CI
    machine: one thread each), for torch here and, through the environment, for the drift/CLI
    subprocesses the tests start; an explicit OMP_NUM_THREADS is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 0:
        threads = max(1, _cores() // workers)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def one_thread():
    """Tiny tensors: torch's intra-op threads only cost, and thrash on a loaded 2-core CI machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
