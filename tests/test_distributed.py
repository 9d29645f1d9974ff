"""Data-parallel training (msgcore.distributed) with 2 CPU processes (gloo), launched by torchrun.

One update on 2 processes, each with its own batch, must give the parameters of one process that
accumulates both batches (`--update-freq 2`), and a checkpoint of the 2-process run must resume on 1 process.
Dropout is off, so the only differences are the order of floating-point sums.
"""
import os
import subprocess
import sys

import pytest
import torch

from msgcore.trainer import load_checkpoint

COMMON = ["train", "--dataset", "synthetic", "--sources", "xa", "--preset", "tiny", "--vocab-size", "60",
          "--max-tokens", "200", "--dropout", "0", "--lr", "3e-3", "--warmup", "1", "--device", "cpu"]


def train(tmp_path, name, *args, processes=1):
    launcher = [sys.executable, "-m", "msgcore"]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                    "-m", "msgcore"]
    env = {**os.environ, "MSGCORE_DATA": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launcher, *COMMON, *args, "--out", str(tmp_path / name)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return load_checkpoint(tmp_path / name / "last.pt")


def assert_same_parameters(a, b):
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    return tmp, {
        "one batch": train(tmp, "uf1", "--max-steps", "1", "--update-freq", "1"),
        "two batches": train(tmp, "uf2", "--max-steps", "1", "--update-freq", "2"),
        "ddp": train(tmp, "ddp", "--max-steps", "1", "--update-freq", "1", processes=2),
    }


def test_two_processes_equal_one_process_on_both_batches(runs):
    _, run = runs
    assert_same_parameters(run["ddp"], run["two batches"])
    with pytest.raises(AssertionError):  # and the second process's batch did count
        assert_same_parameters(run["ddp"], run["one batch"])
    assert run["ddp"]["state"]["step"] == 1 and run["ddp"]["state"]["batch_in_epoch"] == 2


def test_a_two_process_checkpoint_resumes_on_one_process(runs):
    tmp, _ = runs
    resumed = train(tmp, "resumed", "--max-steps", "2", "--update-freq", "2", "--resume", str(tmp / "ddp" / "last.pt"))
    straight = train(tmp, "straight", "--max-steps", "2", "--update-freq", "2")
    assert resumed["state"]["batch_in_epoch"] == straight["state"]["batch_in_epoch"] == 4
    assert_same_parameters(resumed, straight)


# ---- which device a process takes -------------------------------------------------------------------------

def test_each_process_takes_the_gpu_of_its_local_rank(monkeypatch):
    from msgcore import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert distributed.device_for_rank("auto") == torch.device("cuda", 3) == distributed.device_for_rank("cuda")
    assert distributed.device_for_rank("cpu") == torch.device("cpu")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.device_for_rank("cuda:1") == torch.device("cuda", 1)  # one process may name its GPU


def test_a_named_gpu_under_torchrun_or_no_gpu_is_refused_in_one_line(monkeypatch):
    from msgcore import distributed
    from msgcore.utils import MsgcoreError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(MsgcoreError, match="every process on one GPU"):
        distributed.device_for_rank("cuda:1")  # before: the CPU, silently
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MsgcoreError, match="no CUDA device"):
        distributed.device_for_rank("cuda")
    assert distributed.device_for_rank("auto") == torch.device("cpu")


def test_the_chapter_script_refuses_torchrun_before_any_work(monkeypatch, capsys):
    from msgcore.experiments.__main__ import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["ch00", "--scale", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchrun -m msgcore train" in err
