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
    for cap in ("MSGCORE_MAX_UPDATES", "MSGCORE_MAX_SENTENCES"):  # no test runs under a caller's dry-run caps,
        monkeypatch.setenv(cap, "")  # and a test's own caps go when it ends (setenv restores what was there)
