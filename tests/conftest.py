import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _private_run_cache(tmp_path_factory, monkeypatch):
    """Each test gets an empty run cache, so no test reuses another's (or the user's) cached runs."""
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path_factory.mktemp("runcache")))
