"""Data-parallel training on several processes with PyTorch's own engine (torch.distributed, DDP).

    torchrun --nproc_per_node=4 -m msgcore train --dataset multi30k --sources de --target en --out runs/de-en

torchrun starts one process per GPU (or per CPU worker) and sets RANK, LOCAL_RANK and WORLD_SIZE. Every
process builds the same model and the same epoch of token batches; for each update the next
world_size * update_freq batches are dealt out round-robin, so process r trains on batches r, r + W, ...
`DistributedDataParallel` all-reduces the gradients after backward. Process 0 alone validates, logs and
writes checkpoints; the data position it saves counts batches of the whole epoch, so a run can resume on
a different number of processes. NCCL on GPUs, gloo on CPUs.
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from msgcore.utils import MsgcoreError


def launched() -> bool:
    """True in a process that torchrun started as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def device_for_rank(name: str = "auto") -> torch.device:
    """This process's device. "auto" and "cuda": its own GPU (LOCAL_RANK) when CUDA is visible ("auto" falls back to
    the CPU); "cpu": the CPU; "cuda:N": that GPU, in a single process only (several processes on one GPU would race).
    """
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise MsgcoreError(f"--device {name}: no CUDA device is visible to this process")
    if name in ("auto", "cuda"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if launched():
        raise MsgcoreError(f"--device {name} under torchrun would put every process on one GPU; use --device cuda "
                           f"(each process takes the GPU of its LOCAL_RANK) and choose GPUs with CUDA_VISIBLE_DEVICES")
    return torch.device(name)


def init(device: torch.device) -> None:
    """Join the process group torchrun described in the environment (once per process)."""
    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=30))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Process 0: the one that validates, logs and checkpoints."""
    return rank() == 0


def all_reduce_sum(value: float, device: torch.device) -> float:
    """The sum of `value` over all processes (the value itself in a single process)."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.item()


def broadcast_from_main(obj):
    """Process 0's `obj`, on every process (e.g. the validation state, so all agree when to stop)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(together: bool = True) -> None:
    """Leave the process group. `together` (after a run that ended normally) waits for every process first: a
    process that tears gloo down while another is still validating can abort at exit ("terminate called without
    an active exception"). After an error there is no waiting: the other processes may never arrive."""
    if dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()
