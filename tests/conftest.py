"""Process-wide torch settings are put back after every test.

Exact-resume tests compare a run in this process with one in a subprocess bit for bit, which holds
only at the same thread count; a test that changed it (the benchmark sets threads) must not leak.
"""

import pytest
import torch

from conftest_train import single_thread


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.fixture
def one_thread():
    """For the tests of tiny detection models: ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    with single_thread():
        yield
