"""Training: Adam with inverse-sqrt warmup, label smoothing, clipping, accumulation, validation, checkpoints.

Vaswani et al. 2017, §5.3 (Adam, beta2 = 0.98, warmup) and §5.4 (label smoothing 0.1).
# Deviation: the schedule is fairseq's `inverse_sqrt` (linear warmup to a peak `lr`, then
# lr * sqrt(warmup / step)) rather than the paper's d_model^-0.5 form; both decay as step^-0.5,
# and a peak lr is easier to read and tune.

A checkpoint holds the model, optimizer, scheduler, every RNG state and the data position (epoch
and batch), written atomically; `Trainer.resume` continues exactly where the run stopped.

Launched by torchrun on several processes, the Trainer trains with DistributedDataParallel (see
msgcore.distributed): each update deals the next world_size * update_freq batches out round-robin, process 0
validates and checkpoints, and every process resumes from the same global data position. A resumed
multi-process run re-seeds each process's dropout stream (only a single-process resume is bit-exact).
"""
from __future__ import annotations

import contextlib
import errno
from concurrent.futures import ThreadPoolExecutor
import hashlib
import json
import math
import pickle
import random
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm

from msgcore import distributed
from msgcore.batching import EncodedCorpus, collate, example_lengths, token_batches
from msgcore.generation import GenerationConfig
from msgcore.metrics import corpus_score, paired_standard_error, sentence_statistics, statistics_scorer
from msgcore.utils import CheckpointError, MsgcoreError, TrainingError, atomic_write, keep_freed_memory, \
    remove_temporaries

def numerics(device: torch.device, amp_dtype: torch.dtype | None, sdpa_backends: list[SDPBackend]):
    """The context a forward (and its backward) runs in: autocast to `amp_dtype` (None = fp32) and torch's SDPA
    kernels restricted to `sdpa_backends` (empty = torch chooses); see `Trainer.resolve_amp` and
    `Trainer.resolve_sdpa_backends`, which turn a recipe's names into these."""
    stack = contextlib.ExitStack()
    if sdpa_backends:
        stack.enter_context(sdpa_kernel(sdpa_backends))
    stack.enter_context(torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None))
    return stack


CHECKPOINT_KEYS = ("model", "weights_sha256", "model_class", "model_config", "optimizer", "scheduler", "rng",
                   "state", "train_config")
RUN_FILES = ("best.pt", "last.pt", "log.json")  # what a run folder holds (and atomic_write may leave .tmp files of)


@dataclass
class TrainConfig:
    lr: float = 5e-4  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 1000  # linear warmup, then inverse square-root decay
    schedule: str = "inverse_sqrt"  # "inverse_sqrt", or "constant" (lr from the first step, e.g. a fine-tuning phase)
    betas: tuple[float, float] = (0.9, 0.98)  # Adam betas (§5.3)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    label_smoothing: float = 0.1  # epsilon_ls (§5.4)
    clip_norm: float = 1.0  # max gradient L2 norm (0 = no clipping)
    max_tokens: int = 4096  # batch budget: batch size * longest example <= max_tokens
    update_freq: int = 1  # gradient accumulation: batches per optimizer step
    max_epochs: int = 10  # stop after this many epochs
    max_steps: int = 0  # stop after this many optimizer steps (0 = no limit)
    validate_every: int = 0  # validate every N steps (0 = at the end of each epoch)
    save_every: int = 0  # also write last.pt every N steps (0 = only after validations and at the end)
    patience: int = 5  # early stopping: validations without a dev BLEU improvement
    valid_beam: int = 1  # beam size for dev BLEU (1 = greedy, fast)
    valid_max_sentences: int = 0  # score dev BLEU on the first N sentences (0 = all)
    amp: str = "auto"  # "bf16", "fp16" (with a GradScaler), "fp32", or "auto": bf16 on a GPU with native bf16
    # (compute capability >= 8.0), fp16 on an older one (a T4 emulates bf16 at fp32 speed), fp32 on a CPU
    sdpa_backends: tuple[str, ...] = ()  # torch SDPA backends the training loss may use, e.g. ("math",); () = torch's
    # choice. Same attention, other kernels: on 2 CPU threads under bf16, "math" made a training step 1.28-1.37x (small
    # Transformer) and 1.6x (MixRep) faster than torch's fused kernel, so chapter 0's CPU recipe (`small`) takes it.
    # A CPU setting: on a GPU torch chooses (its fused kernels), so a CPU recipe run on a GPU does not inherit it
    seed: int = 0  # seeds initialisation-independent randomness: batches and dropout
    log_every: int = 50  # steps between training-loss log rows
    progress: bool = True  # tqdm progress bar


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (0-based)
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    best_bleu: float = -1.0  # best dev BLEU so far
    best_step: int = -1  # the step best.pt was saved at (-1 = none yet)
    bad_validations: int = 0  # validations since the best one
    source_tokens: int = 0  # real source tokens trained on so far (every process): the run's budget
    target_tokens: int = 0  # real target tokens trained on so far (every process)
    history: list = field(default_factory=list)  # log rows: {"kind": "train"|"valid", ...}
    wall_time_s: float = 0.0  # training wall time up to this checkpoint, over every resume (work lost to a kill not)


def native_bf16(device: torch.device) -> bool:
    """True on a GPU whose tensor cores compute in bf16 (compute capability 8.0 or newer). torch's
    is_bf16_supported() also says True on a T4 (7.5), which only emulates bf16."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0)


def inverse_sqrt(warmup_steps: int):
    """LR multiplier: linear warmup over `warmup_steps`, then sqrt(warmup / step)."""
    def factor(step: int) -> float:
        step = step + 1
        return min(step / warmup_steps, math.sqrt(warmup_steps / step))
    return factor


def lr_schedule(name: str, warmup_steps: int):
    """The LambdaLR multiplier named by TrainConfig.schedule."""
    if name == "constant":
        return lambda step: 1.0
    if name == "inverse_sqrt":
        return inverse_sqrt(warmup_steps)
    raise TrainingError(f"unknown schedule {name!r}; use 'inverse_sqrt' or 'constant'")


def rng_state() -> dict:
    """Every RNG's state as tensors, numbers and tuples: what `torch.load(weights_only=True)` accepts."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                       "gauss": float(gauss)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state(("MT19937", numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def weights_sha256(weights: dict) -> str:
    """SHA-256 of a state dict by value (names, dtypes, shapes and bytes): stored in every checkpoint and checked
    on load, so that a damaged file never translates silently."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_checkpoint(checkpoint: dict, path: Path) -> None:
    """torch.save through atomic_write; a full disk or an I/O error becomes one CheckpointError line."""
    try:
        with atomic_write(path, "wb") as f:
            torch.save(checkpoint, f)
    except (OSError, RuntimeError) as error:
        full = getattr(error, "errno", None) == errno.ENOSPC or "enforce fail" in str(error) \
            or "No space left" in str(error)
        reason = "no space left on device" if full else f"cannot write ({type(error).__name__}: " \
                                                          f"{str(error).splitlines()[0] if str(error) else ''})"
        raise CheckpointError(f"{reason} while writing {path}; the previous checkpoint is intact") from None


def checkpoint_space(parameters: int, out_dir: Path) -> int:
    """Bytes a run of a model with `parameters` float32 weights still needs in `out_dir` for its checkpoints. At
    most 7 copies of the weights lie there at once: last.pt (the weights and Adam's two moments) written beside the
    previous last.pt before it replaces it (6), and best.pt (1). The checkpoints already there count as held."""
    weights = 4 * parameters
    held = sum((out_dir / name).stat().st_size for name in ("last.pt", "best.pt") if (out_dir / name).is_file())
    return max(7 * weights - held, 0)


def best_on_disk(out_dir: Path) -> tuple[float, int] | None:
    """(best_bleu, step) recorded in out_dir/best.pt, or None when there is no readable best.pt."""
    try:
        state = load_checkpoint(out_dir / "best.pt")["state"]
    except CheckpointError:
        return None
    return state["best_bleu"], state["step"]


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Read a checkpoint, refusing missing, truncated, foreign, damaged or diverged files with one clear line.

    Only tensors and plain data are unpickled (`weights_only=True`): a file holding other objects is refused,
    since unpickling them could run code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only" not in str(error).lower():
            raise CheckpointError(f"checkpoint {path} is corrupt or truncated (UnpicklingError)") from None
        raise CheckpointError(f"checkpoint {path} holds Python objects besides tensors and plain data; refused, "
                              f"since loading it could run code (a file msgcore did not write, or an older "
                              f"msgcore's)") from None
    except Exception as error:  # torch raises several types for a damaged zip/pickle
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({type(error).__name__})") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise CheckpointError(f"{path} is not a msgcore checkpoint (missing {', '.join(missing)})")
    check_weights(checkpoint, path)
    return checkpoint


def check_weights(checkpoint: dict, path: Path) -> None:
    """The weights must be a state dict of tensors that matches its stored SHA-256 and holds only finite values."""
    weights = checkpoint["model"]
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise CheckpointError(f"{path} is not a msgcore checkpoint (its model entry is not a state dict)")
    if weights_sha256(weights) != checkpoint["weights_sha256"]:
        raise CheckpointError(f"checkpoint {path} is damaged: its weights do not match their SHA-256")
    if not all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point()):
        raise CheckpointError(f"checkpoint {path} holds NaN/inf weights (a diverged run?)")


class LossModule(nn.Module):
    """`model.loss` as a forward pass, so that DistributedDataParallel can hook it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch, label_smoothing: float) -> torch.Tensor:
        return self.model.loss(batch, label_smoothing)


class Trainer:
    """Trains `model` on `train_data`; validates dev BLEU on `valid_data` against `valid_refs`."""

    def __init__(self, model, tokenizer, train_data: EncodedCorpus, valid_data: EncodedCorpus | None,
                 valid_refs: list[str] | None, cfg: TrainConfig, device: torch.device, out_dir: str | Path):
        self.model, self.tokenizer, self.cfg, self.device = model.to(device), tokenizer, cfg, device
        self.train_data, self.valid_data, self.valid_refs = train_data, valid_data, valid_refs
        self.out_dir = Path(out_dir)
        self.lengths = self.example_lengths(train_data)
        groups = [{"params": g["params"], "lr": cfg.lr * g.get("lr_scale", 1.0)} for g in model.parameter_groups()]
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=1e-8,
                                           weight_decay=cfg.weight_decay, fused=device.type == "cuda")
        self.scheduler = LambdaLR(self.optimizer, lr_schedule(cfg.schedule, cfg.warmup_steps))
        self.state = TrainState()
        self.wall_origin: float | None = None  # perf_counter() minus the wall time trained so far, set by train()
        self.best_statistics = None  # the best validation's per-sentence BLEU statistics (`validate_here`'s noise)
        self.run_info: dict = {}  # what the caller wants kept with each checkpoint (the CLI: its options, data hash)
        self.amp_dtype = self.resolve_amp(cfg.amp, device)
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None  # fp16's range
        if self.amp_dtype is None and native_bf16(device):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fp32 on Ampere+: TF32
        self.sdpa_backends = self.resolve_sdpa_backends(cfg.sdpa_backends, device)
        if device.type == "cpu":
            keep_freed_memory()  # large tensors reuse freed memory instead of fresh, page-faulting mappings
        self.world, self.rank = distributed.world_size(), distributed.rank()
        self.ddp = None  # the DistributedDataParallel wrapper, when several processes train together
        if self.world > 1:
            self.ddp = DistributedDataParallel(LossModule(self.model), device_ids=[device.index] if device.type == "cuda"
                                               else None, broadcast_buffers=False, find_unused_parameters=True)

    @staticmethod
    def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
        """The autocast dtype TrainConfig.amp asks for on `device` (None = fp32)."""
        if amp not in ("auto", "bf16", "fp16", "fp32"):
            raise TrainingError(f"unknown amp {amp!r}; use 'auto', 'bf16', 'fp16' or 'fp32'")
        if amp == "auto" and device.type == "cuda":
            return torch.bfloat16 if native_bf16(device) else torch.float16
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)

    @staticmethod
    def resolve_sdpa_backends(names, device: torch.device | None = None) -> list[SDPBackend]:
        """TrainConfig.sdpa_backends as torch's SDPBackend members (empty = torch chooses), on a CPU (or with no
        device given); on any other device torch chooses. Unknown names are refused everywhere."""
        known = [name.lower() for name in SDPBackend.__members__ if name != "ERROR"]
        if isinstance(names, str) or any(str(name) not in known for name in names):
            raise TrainingError(f"unknown sdpa_backends {names!r}; use a tuple of {known}")
        if device is not None and device.type != "cpu":
            return []
        return [SDPBackend.__members__[name.upper()] for name in names]

    # ---- batches: hooks for a model whose examples carry more than sources and one target ---------------
    def collate(self, data: EncodedCorpus, indices: list[int]):
        """Hook: pad the examples at `indices` into a batch for `model.loss` (training and dev loss)."""
        return collate(data, indices)

    def example_lengths(self, data: EncodedCorpus) -> list[int]:
        """Hook: the padded length each example needs, which the token budget of a batch counts."""
        return example_lengths(data)

    @staticmethod
    def source_tokens(batch) -> int:
        """Hook: the real source tokens of a batch, every source counted (read before it moves to the device)."""
        return sum(int(mask.sum()) for mask in getattr(batch, "source_masks", ()))

    # ---- one optimizer step -------------------------------------------------------------
    def loss_sum(self, batch) -> torch.Tensor:
        """The model's summed loss over the real target tokens of one batch (see `Transformer.loss`)."""
        with numerics(self.device, self.amp_dtype, self.sdpa_backends):
            if self.ddp is not None and self.model.training:
                return self.ddp(batch, self.cfg.label_smoothing)
            return self.model.loss(batch, self.cfg.label_smoothing)

    def train_step(self, batches: list, source_tokens: int = 0,
                   target_tokens: int | None = None) -> tuple[torch.Tensor, int]:
        """One update over this process's batches; the loss is averaged over the target tokens of every
        process's batches. Returns this process's share of that loss, still on the device (`log_train` reads it,
        and checks it is finite, at its log steps: no host sync per update), and the token count; the run's budget
        counts them and `source_tokens`. `target_tokens` is this process's count, read off the batches on the host
        (counted on the device batches when not given)."""
        self.model.train()
        local = sum(b.num_target_tokens for b in batches) if target_tokens is None else target_tokens
        n_tokens = distributed.all_reduce_sum(local, self.device)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1  # DDP all-reduces the gradients on the last backward only
            with self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext():
                loss = self.loss_sum(batch) / n_tokens
                scaled = self.scaler.scale(loss) if self.scaler else loss
                (scaled * self.world if self.world > 1 else scaled).backward()  # DDP averages over processes
            total += loss.detach()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
        if self.cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)  # skipped when a gradient overflowed; the scale is then halved
            self.scaler.update()
        else:
            self.optimizer.step()
        with warnings.catch_warnings():  # after a skipped fp16 step torch warns that the schedule steps first:
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")  # it counts updates
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        self.state.target_tokens += int(n_tokens)
        self.state.source_tokens += int(distributed.all_reduce_sum(source_tokens, self.device))
        return total, int(n_tokens)

    # ---- the loop ----------------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return token_batches(self.lengths, self.cfg.max_tokens, shuffle=True, seed=self.cfg.seed, epoch=epoch)

    def done(self) -> bool:
        cfg, state = self.cfg, self.state
        return (state.epoch >= cfg.max_epochs or (cfg.max_steps and state.step >= cfg.max_steps)
                or (cfg.patience and state.bad_validations >= cfg.patience))

    def train(self) -> list[dict]:
        """Run until max_epochs, max_steps or early stopping; returns the log history."""
        if self.state.step == 0:  # a fresh run; a resumed one restored its RNG states instead
            torch.manual_seed(self.cfg.seed + self.rank)  # each process its own dropout stream
        self.wall_origin = time.perf_counter() - self.state.wall_time_s  # a resumed run's clock goes on from its checkpoint
        while not self.done():
            self.run_epoch()
        if self.validated_steps() and self.validated_steps()[-1] != self.state.step:
            self.validate()  # stopped by max_steps between validations: best.pt must not be from an earlier step
        self.save_checkpoint(self.out_dir / "last.pt")
        self.save_log()
        return self.state.history

    def validated_steps(self) -> list[int]:
        """The steps at which validation ran, in order (empty when no validation data)."""
        if self.valid_data is None:
            return []
        return [row["step"] for row in self.state.history if row["kind"] == "valid"] or [-1]

    def update_chunks(self, batches: list[list[int]]):
        """(number of batches, this process's collated batches on the host) for each update left in the epoch.
        On a GPU the next update's batches are collated in a background thread while the current one trains."""
        state, cfg = self.state, self.cfg
        starts = range(state.batch_in_epoch, len(batches) - self.world + 1, cfg.update_freq * self.world)

        def collated(start: int) -> tuple[int, list]:
            chunk = batches[start: start + cfg.update_freq * self.world]
            batches_here = [self.collate(self.train_data, idx) for idx in chunk[self.rank::self.world]]
            if self.device.type == "cuda":  # pinned host memory: the copy to the GPU runs without blocking
                batches_here = [batch.pin_memory() for batch in batches_here]
            return len(chunk), batches_here
        if self.device.type != "cuda":
            yield from map(collated, starts)
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = None
            for start in starts:
                current, pending = (pending or pool.submit(collated, start)), None
                following = start + cfg.update_freq * self.world
                if following < len(batches) - self.world + 1:
                    pending = pool.submit(collated, following)
                yield current.result()

    def run_epoch(self) -> None:
        state, cfg = self.state, self.cfg
        batches = self.epoch_batches(state.epoch)  # the whole epoch, the same in every process
        bar = tqdm(total=len(batches), initial=state.batch_in_epoch, desc=f"epoch {state.epoch + 1}",
                   disable=not cfg.progress or self.rank > 0, leave=False, mininterval=10)
        window = {"loss": 0.0, "tokens": 0, "start": time.perf_counter(), "from": state.step + 1}
        for size, on_host in self.update_chunks(batches):
            if self.done():
                break
            source_tokens = sum(self.source_tokens(batch) for batch in on_host)
            target_tokens = sum(batch.num_target_tokens for batch in on_host)
            loss, tokens = self.train_step([batch.to(self.device, non_blocking=True) for batch in on_host],
                                           source_tokens, target_tokens)
            state.batch_in_epoch += size
            bar.update(size)
            self.log_train(window, loss, tokens)
            if cfg.validate_every and state.step % cfg.validate_every == 0:
                self.validate()
            elif cfg.save_every and state.step % cfg.save_every == 0:
                self.save_checkpoint(self.out_dir / "last.pt")
                self.save_log()
        bar.close()
        self.check_finite(window)  # the steps since the last log row
        if state.batch_in_epoch + self.world > len(batches):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            if not cfg.validate_every:
                self.validate()

    def check_finite(self, window: dict) -> float:
        """The window's mean loss over every process (a host sync, once per log row), refused when not finite."""
        if not window["tokens"]:
            return 0.0
        loss = distributed.all_reduce_sum(float(window["loss"]), self.device) / window["tokens"]
        if not math.isfinite(loss):
            raise TrainingError(f"loss is {loss} in steps {window['from']}–{self.state.step} (epoch "
                                f"{self.state.epoch + 1}); lower the learning rate or check the data")
        return loss

    def log_train(self, window: dict, loss: torch.Tensor, tokens: int) -> None:
        window["loss"] = window["loss"] + loss * tokens  # on the device: read at log steps only
        window["tokens"] += tokens
        if self.state.step % self.cfg.log_every:
            return
        elapsed = time.perf_counter() - window["start"]
        self.state.history.append({"kind": "train", "step": self.state.step, "epoch": self.state.epoch + 1,
                                   "loss": self.check_finite(window), "lr": self.scheduler.get_last_lr()[0],
                                   "tokens_per_s": window["tokens"] / elapsed, **self.budget()})
        window.update(loss=0.0, tokens=0, start=time.perf_counter(), **{"from": self.state.step + 1})

    # ---- validation ----------------------------------------------------------------------
    @torch.no_grad()
    def valid_loss(self) -> float:
        self.model.eval()
        total, n_tokens = 0.0, 0
        lengths = self.example_lengths(self.valid_data)
        for idx in token_batches(lengths, self.cfg.max_tokens, shuffle=False):
            batch = self.collate(self.valid_data, idx).to(self.device)
            total += self.loss_sum(batch).item()
            n_tokens += batch.num_target_tokens
        return total / n_tokens

    def validate(self) -> None:
        """Dev loss and BLEU; keep the best checkpoint; count validations without improvement.

        With several processes, process 0 validates and the others take its state (to stop together)."""
        if self.valid_data is None:
            return  # nothing to validate on; train() saves last.pt when it ends
        if self.rank == 0:
            self.validate_here()
        vars(self.state).update(vars(distributed.broadcast_from_main(self.state)))  # in place: callers hold it

    def budget(self) -> dict:
        """What the run has trained on so far: the log rows carry it, and the verdict protocol compares it."""
        return {"source_tokens": self.state.source_tokens, "target_tokens": self.state.target_tokens}

    def validate_here(self) -> None:
        """Dev BLEU, and its noise: the bootstrap standard error of the change since the best validation (None
        for the first validation of a process), which says how large a dev gain the dev sentences can resolve."""
        limit = self.cfg.valid_max_sentences or len(self.valid_data)
        hypotheses = translate_encoded(self.model, self.tokenizer, self.valid_data, self.device,
                                       GenerationConfig(beam_size=self.cfg.valid_beam), limit=limit,
                                       amp_dtype=self.amp_dtype)
        bleu = corpus_score("bleu", hypotheses, self.valid_refs[:limit]).score
        statistics = sentence_statistics("bleu", hypotheses, self.valid_refs[:limit])
        noise = None if self.best_statistics is None else \
            paired_standard_error(statistics, self.best_statistics, statistics_scorer("bleu"))
        state = self.state
        state.history.append({"kind": "valid", "step": state.step, "epoch": state.epoch,
                              "valid_loss": self.valid_loss(), "valid_bleu": bleu, "valid_noise": noise,
                              **self.budget()})
        improved = bleu > state.best_bleu
        state.best_bleu, state.bad_validations = (bleu, 0) if improved else (state.best_bleu,
                                                                             state.bad_validations + 1)
        if improved:  # best.pt first: a kill between the two saves never leaves last.pt ahead of best.pt
            state.best_step, self.best_statistics = state.step, statistics
            self.save_checkpoint(self.out_dir / "best.pt", optimizer=False)
        self.save_checkpoint(self.out_dir / "last.pt")
        self.save_log()

    def save_log(self) -> None:
        if self.rank > 0:
            return
        with atomic_write(self.out_dir / "log.json") as f:
            json.dump(self.state.history, f, indent=1)

    # ---- checkpoints ---------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path, optimizer: bool = True) -> None:
        """Write everything `resume` needs, atomically (process 0 only). Without `optimizer` (best.pt: read for its
        weights, never trained on) the Adam state, two thirds of the file, is left out."""
        if self.rank > 0:
            return
        if self.wall_origin is not None:
            self.state.wall_time_s = time.perf_counter() - self.wall_origin
        checkpoint = {
            "model": (weights := self.model.state_dict()), "weights_sha256": weights_sha256(weights),
            "model_class": type(self.model).__name__, "model_config": self.model.cfg.to_dict(),
            "optimizer": self.optimizer.state_dict() if optimizer else None,
            "scheduler": self.scheduler.state_dict(), "rng": rng_state(), "state": asdict(self.state),
            "train_config": asdict(self.cfg),
            "tokenizer": self.tokenizer.to_bytes() if self.tokenizer is not None else None,
            "run_info": self.run_info, "scaler": self.scaler.state_dict() if self.scaler else None,
        }
        write_checkpoint(checkpoint, Path(path))

    def resume(self, path: str | Path) -> None:
        """Restore model, optimizer, scheduler, RNG and data position from `path` (a best.pt holds no optimizer
        state: the optimizer is then left as it is, for a model that is read, not trained on).

        Resuming from last.pt also removes the temporary files a killed save left, and checks the run's
        best.pt: one that is damaged or missing is replaced by validating last.pt's model now (said in a
        warning), so that the run never ends with an unreadable best checkpoint."""
        checkpoint = load_checkpoint(path)
        if checkpoint["model_class"] != type(self.model).__name__:
            raise CheckpointError(f"{path} holds a {checkpoint['model_class']}, not a {type(self.model).__name__}")
        try:
            self.model.load_state_dict(checkpoint["model"])
        except RuntimeError as error:
            raise CheckpointError(f"{path} does not fit this model: {str(error).splitlines()[0]}") from None
        try:
            if checkpoint["optimizer"] is not None:
                self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.scheduler.load_state_dict(checkpoint["scheduler"])
            if self.scaler and checkpoint.get("scaler"):
                self.scaler.load_state_dict(checkpoint["scaler"])
            self.state = TrainState(**checkpoint["state"])
            check_state_types(self.state)
            set_rng_state(checkpoint["rng"])
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as error:
            raise CheckpointError(f"{path}: its trainer or RNG state is unreadable ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0] if str(error) else 'wrong types'})") from None
        if self.world > 1:  # the checkpoint holds process 0's RNG: give each process a stream of its own
            torch.manual_seed(self.cfg.seed + 1000 * self.state.step + self.rank)
        if Path(path).name != "best.pt":
            if self.rank == 0:
                remove_temporaries(self.out_dir, RUN_FILES)
            self.replace_unreadable_best()

    def replace_unreadable_best(self) -> None:
        """A best.pt that last.pt's record promises but that is damaged or missing: validate now, which writes
        a new one (the best of the earlier validations is lost; the warning says so)."""
        best = self.out_dir / "best.pt"
        if self.state.best_step < 0 or self.valid_data is None:
            return
        try:
            load_checkpoint(best)
            return
        except CheckpointError as error:
            problem = str(error)
        print(f"warning: {problem}; the run goes on from last.pt (step {self.state.step}) and validates it now for "
              f"a new best.pt (the best so far, step {self.state.best_step}, is lost)", file=sys.stderr)
        self.state.best_bleu, self.state.best_step, self.state.bad_validations = -1.0, -1, 0
        self.validate()


def check_state_types(state: TrainState) -> None:
    """TrainState's fields must have their types: a garbage state is refused before training on it."""
    whole = ("step", "epoch", "batch_in_epoch", "best_step", "bad_validations", "source_tokens", "target_tokens")
    if any(type(getattr(state, name)) is not int for name in whole) or not isinstance(state.best_bleu, (int, float)) \
            or not isinstance(state.history, list) or not isinstance(state.wall_time_s, (int, float)) or state.step < 0 or state.epoch < 0 or state.batch_in_epoch < 0:
        raise TypeError("wrong types or negative counters in the trainer state")


# Tokens per decoding batch (source tokens × beam), by device type: a GPU decodes larger batches in the same time.
DECODE_TOKENS = {"cpu": 6000, "cuda": 24000}


@torch.no_grad()
def translate_encoded(model, tokenizer, data: EncodedCorpus, device: torch.device, cfg: GenerationConfig,
                      limit: int = 0, max_tokens: int | None = None, amp_dtype=None) -> list[str]:
    """Decode the sources of `data` (in corpus order) to detokenized strings, in batches of `max_tokens` (by
    default the device type's DECODE_TOKENS)."""
    max_tokens = max_tokens or DECODE_TOKENS.get(device.type, DECODE_TOKENS["cpu"])
    n = min(limit or len(data), len(data))
    subset_lengths = example_lengths(data)[:n]
    hypotheses: list[str] = [""] * n
    forbidden = [tokenizer.pad_id, tokenizer.bos_id]
    for idx in token_batches(subset_lengths, max_tokens // max(1, cfg.beam_size), shuffle=False):
        batch = collate(data, idx).to(device)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            ids = model.generate(batch.sources, batch.source_masks, data.target_prefix,
                           tokenizer.eos_id, cfg, forbidden)
        for i, hyp in zip(idx, ids):
            hypotheses[i] = tokenizer.decode(hyp)
    return hypotheses


def load_model(path, device: torch.device | str = "cpu"):
    """Rebuild the model and tokenizer stored in a checkpoint, in eval mode on `device`."""
    from msgcore.models import MODELS  # the registry imports every paper's model: import it late

    checkpoint = load_checkpoint(path)
    if checkpoint["model_class"] not in MODELS or checkpoint.get("tokenizer") is None:
        raise CheckpointError(f"{path}: cannot rebuild a {checkpoint['model_class']} (unknown class or no tokenizer)")
    model = build_model(MODELS[checkpoint["model_class"]], checkpoint, path)
    try:
        tokenizer = model.tokenizer_class.from_bytes(checkpoint["tokenizer"])
    except MsgcoreError as error:
        raise CheckpointError(f"{path}: its tokenizer is unreadable ({error})") from None
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise CheckpointError(f"{path}: its tokenizer has {tokenizer.vocab_size} pieces but the model's embedding "
                              f"has {model.cfg.vocab_size}; the checkpoint mixes two runs")
    return model.to(device).eval(), tokenizer


def build_model(model_class, checkpoint: dict, path) -> nn.Module:
    """The checkpoint's model with its weights; a config or weights that do not fit raise CheckpointError."""
    try:
        model = model_class(model_class.config_class(**checkpoint["model_config"]))
    except (TypeError, ValueError, MsgcoreError) as error:
        raise CheckpointError(f"{path}: its model_config does not build a {checkpoint['model_class']} "
                              f"({str(error).splitlines()[0]})") from None
    try:
        model.load_state_dict(checkpoint["model"])
    except (RuntimeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: the weights do not fit its model_config "
                              f"({str(error).splitlines()[0]})") from None
    return model
