"""Shared fixtures of the test suite."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny tensors: torch's intra-op threads only cost, and thrash on a loaded 2-core CI machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
