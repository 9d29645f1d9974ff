"""CUDA graphs over bucketed batch shapes: the book's whole training update captured once per batch shape, then
replayed (the GPU bench's "CUDA graphs" variant, msgcore.bench_gpu).

Why: on a GPU a `small` update is launch-bound. On one H200 it took ~24 ms of wall time for 6.8 ms of kernels: about
700 kernels per update, each dispatched by the host one by one. A CUDA graph records those kernels once and launches
them all with one call, so the host's dispatching leaves the update's critical path.

A graph replays fixed shapes at fixed addresses, while the book's token batches come in many shapes. So every batch
is padded up to one of a few bucket shapes (rows, source length, target length), `bucket_of`: lengths rounded up to
a multiple of LENGTH_STEP, rows to a number with ROW_BITS bits after the leading one (at most 1/4 more rows). On the
bench's batches that is 8-9 buckets at 2k and 8k tokens per batch, for about 1.2× the padded slots. The padding is
masked out (`pad_into`): pad tokens are ignored by the loss and masked as keys, so the loss is the unpadded one up to
floating-point noise.

The capture follows torch's whole-network recipe (torch.cuda.graphs, "whole-network capture"):
    * the optimizer is AdamW with fused=True and capturable=True, its learning rate a device tensor that the
      schedule fills between replays (a Python float would be baked into the graph);
    * a few warm-up updates on a side stream before the capture (they create the optimizer's state and the
      libraries' handles), grads set to None so that backward allocates them from the graph's private pool;
    * autocast with cache_enabled=False; no host sync inside (the loss is read back only as a tensor, and the token
      count it is averaged over is a device tensor too);
    * each replay reads static input buffers, which `pad_into` fills before it.
The warm-up updates change the weights and the optimizer state; both are put back afterwards, so that a captured run
starts from the same weights as the book's (the bench's golden check compares the two).

`BucketedUpdate` is the padding and the static-buffer update alone, run eagerly (any device: the CPU tests check it);
`GraphedUpdate` captures it per bucket on a CUDA device. Both take `Trainer.train_step`'s arguments and return what
it returns, so that the bench drives them like a Trainer.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.attention import sdpa_kernel
from torch.optim.lr_scheduler import LambdaLR

from msgcore.batching import Batch, EncodedCorpus
from msgcore.trainer import Trainer, lr_schedule
from msgcore.utils import MsgcoreError

LENGTH_STEP = 8  # lengths rounded up to a multiple of 8 (16 padded 1.35× instead of 1.23× on the bench's batches)
ROW_BITS = 2  # rows rounded up to m · 2^k with m in 4..7: four sizes per doubling
WARMUP_UPDATES = 3  # eager updates on the side stream before each capture (the recipe's few iterations)

Shape = tuple[int, int, int]  # (rows B, source length S, target length T)


# ---- the buckets -----------------------------------------------------------------------------------------------

def round_rows(rows: int, bits: int = ROW_BITS) -> int:
    """`rows` rounded up to keep `bits` bits after the leading one: 300 -> 320, 513 -> 640 (at most 1/4 more)."""
    unit = 1 << max(rows.bit_length() - 1 - bits, 0)
    return -(-rows // unit) * unit


def round_length(length: int, step: int = LENGTH_STEP, limit: int | None = None) -> int:
    """`length` rounded up to a multiple of `step`, but never past `limit` (the model's position table) when the
    length itself fits it."""
    rounded = -(-length // step) * step
    return rounded if limit is None else min(rounded, max(length, limit))


def bucket_of(shape: Shape, limit: int | None = None) -> Shape:
    """The bucket a batch of `shape` (B, S, T) is padded to: every side at least as large."""
    rows, source_length, target_length = shape
    return round_rows(rows), round_length(source_length, limit=limit), round_length(target_length, limit=limit)


def shape_of(batch: Batch) -> Shape:
    """(B, S, T) of a collated batch: S its longest source (every source is padded to it), T its target length."""
    return len(batch.target_in), max(s.size(1) for s in batch.sources), batch.target_in.size(1)


def shape_of_indices(data: EncodedCorpus, indices: list[int]) -> Shape:
    """(B, S, T) that `collate(data, indices)` will have, read off the lengths (no collation)."""
    source_length = max(len(column[i]) for column in data.sources for i in indices)
    return len(indices), source_length, max(len(data.target[i]) for i in indices) + 1  # + 1: the prefix / eos


# ---- the padding -----------------------------------------------------------------------------------------------

def empty_batch(bucket: Shape, sources: int, pad_id: int, device: torch.device) -> Batch:
    """A batch of `bucket`'s shape that is all padding rows (see `pad_into`): the static buffers a graph reads."""
    rows, source_length, target_length = bucket
    tokens = lambda length: torch.full((rows, length), pad_id, dtype=torch.long, device=device)  # (B, L)
    masks = lambda length: torch.zeros((rows, length), dtype=torch.bool, device=device)  # (B, L)
    source_masks = [masks(source_length) for _ in range(sources)]
    for mask in source_masks:
        mask[:, 0] = True  # one visible key per padding row
    return Batch([tokens(source_length) for _ in range(sources)], source_masks, tokens(target_length),
                 tokens(target_length), masks(target_length), list(range(rows)), pad_id)


def pad_into(out: Batch, batch: Batch) -> Batch:
    """Write `batch` into the larger `out` in place, its examples in the first rows and columns, padding elsewhere;
    returns `out`.

    Padding is pad tokens with a False mask: the loss ignores pad labels and attention never reads a masked key.
    Each padding row keeps one visible source key (a pad token at position 0): a row with every key masked may come
    out NaN from SDPA's kernels, and through 0 × NaN a NaN in a padding row would reach the weights' gradients. Its
    target mask stays False, so `out.num_target_tokens` is still the batch's."""
    rows = len(batch.target_in)
    for big, small in zip(out.sources, batch.sources):
        fill(big, small, out.pad_id)
    for big, small in zip(out.source_masks, batch.source_masks):
        fill(big, small, False)
        big[rows:, 0] = True  # (B_pad,): one key for each padding row
    fill(out.target_in, batch.target_in, out.pad_id)
    fill(out.target_out, batch.target_out, out.pad_id)
    fill(out.target_mask, batch.target_mask, False)
    return out


def fill(big: Tensor, small: Tensor, value) -> None:
    """big (B', L') := small (B, L) in its top-left corner, `value` elsewhere."""
    big.fill_(value)
    big[:small.size(0), :small.size(1)].copy_(small)


def pad_to_bucket(batch: Batch, bucket: Shape | None = None) -> Batch:
    """A new batch: `batch` padded to `bucket` (by default `bucket_of` its shape)."""
    bucket = bucket or bucket_of(shape_of(batch))
    if any(b < s for b, s in zip(bucket, shape_of(batch))):
        raise MsgcoreError(f"a batch of shape {shape_of(batch)} does not fit the bucket {bucket}")
    device = batch.target_in.device
    return pad_into(empty_batch(bucket, len(batch.sources), batch.pad_id, device), batch)


# ---- the update on static buffers ------------------------------------------------------------------------------

@dataclass
class Static:
    """One bucket's buffers: the padded batch the update reads, the token count its loss is averaged over, the loss
    it writes, and its graph (None when run eagerly)."""
    batch: Batch
    n_tokens: Tensor  # () fp32 on the device: a graph cannot read a host number that changes
    loss: Tensor | None = None  # () fp32, written by each run
    graph: torch.cuda.CUDAGraph | None = None


class BucketedUpdate:
    """The book's update (`Trainer.train_step`: forward, backward, clipping, the optimizer's step, the schedule) on
    batches padded to their buckets, run eagerly: the padding half of the "CUDA graphs" variant, on any device."""

    def __init__(self, trainer: Trainer):
        if trainer.scaler is not None or trainer.ddp is not None:
            raise MsgcoreError("bucketed CUDA-graph updates take bf16 or fp32 on one process (fp16's GradScaler "
                               "and DDP sync with the host)")
        self.trainer = trainer
        trainer.model.train()  # dropout as the book trains (a graph records the mode it was captured in)
        self.limit = trainer.model.cfg.max_positions  # no bucket pads past the position table
        self.sources = 1  # sources per example: the book's Transformer reads one
        self.buckets: dict[Shape, Static] = {}

    def numerics(self):
        """The trainer's autocast and SDPA kernels, with autocast's cast cache off (graph capture requires it)."""
        trainer, stack = self.trainer, contextlib.ExitStack()
        if trainer.sdpa_backends:
            stack.enter_context(sdpa_kernel(trainer.sdpa_backends))
        amp = trainer.amp_dtype
        stack.enter_context(torch.autocast(trainer.device.type, dtype=amp or torch.float32, enabled=amp is not None,
                                           cache_enabled=False))
        return stack

    def update(self, static: Static) -> Tensor:
        """Forward, backward, clipping and the optimizer's step on `static`'s buffers: what a graph captures. Returns
        the loss averaged over the real target tokens, () on the device."""
        trainer = self.trainer
        with self.numerics():
            loss_sum = trainer.model.loss(static.batch, trainer.cfg.label_smoothing)  # () fp32
        loss = loss_sum / static.n_tokens  # ()
        loss.backward()
        if trainer.cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.cfg.clip_norm)
        trainer.optimizer.step()
        return loss.detach()

    def static_for(self, shape: Shape) -> Static:
        """The buffers of the bucket of a batch of `shape`, made on first sight."""
        bucket = bucket_of(shape, self.limit)
        if bucket not in self.buckets:
            batch = empty_batch(bucket, self.sources, self.trainer.model.cfg.pad_id, self.trainer.device)
            self.buckets[bucket] = self.prepared(Static(batch, torch.ones((), device=self.trainer.device)))
        return self.buckets[bucket]

    def prepared(self, static: Static) -> Static:
        """Hook: what a new bucket needs before its first update (a graph: its capture)."""
        return static

    def run(self, static: Static) -> None:
        """One update on `static`'s buffers, which hold this batch: here eagerly, grads set to None after it."""
        static.loss = self.update(static)
        self.trainer.optimizer.zero_grad(set_to_none=True)

    def train_step(self, batches: list[Batch], source_tokens: int = 0,
                   target_tokens: int | None = None) -> tuple[Tensor, int]:
        """`Trainer.train_step` for one batch: its loss () on the device and its target tokens."""
        if len(batches) != 1:
            raise MsgcoreError(f"a bucketed update takes one batch, not {len(batches)} (no accumulation)")
        (batch,) = batches
        if len(batch.sources) != self.sources:
            raise MsgcoreError(f"a bucketed update takes {self.sources} source per example, not {len(batch.sources)}")
        n_tokens = batch.num_target_tokens if target_tokens is None else target_tokens
        static = self.static_for(shape_of(batch))
        pad_into(static.batch, batch)
        static.n_tokens.fill_(n_tokens)
        self.run(static)
        with warnings.catch_warnings():  # a replayed step is not a call torch's schedule sees: it would warn
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
            self.trainer.scheduler.step()
        state = self.trainer.state
        state.step, state.target_tokens = state.step + 1, state.target_tokens + n_tokens
        state.source_tokens += source_tokens
        return static.loss.clone(), n_tokens  # a copy: the next replay of this bucket overwrites static.loss


# ---- the graphs ------------------------------------------------------------------------------------------------

class GraphedUpdate(BucketedUpdate):
    """`BucketedUpdate` with each bucket's update captured in a CUDA graph (on its first batch, or all at once by
    `capture`) and replayed; `graphs` and `capture_s` say how many and how long their captures took."""

    def __init__(self, trainer: Trainer):
        if trainer.device.type != "cuda":
            raise MsgcoreError(f"CUDA graphs need a CUDA device, not {trainer.device.type}")
        super().__init__(trainer)
        capturable_adamw(trainer)
        self.stream = torch.cuda.Stream(trainer.device)  # one side stream for the warm-ups and every capture
        self.capture_s = 0.0

    @property
    def graphs(self) -> int:
        return len(self.buckets)

    def capture(self, shapes: list[Shape]) -> None:
        """Capture the graphs of every bucket these batch shapes need (before timing: a capture costs a pause)."""
        for shape in shapes:
            self.static_for(shape)

    def prepared(self, static: Static) -> Static:
        """Warm up on the side stream, capture the update into `static.graph`, then put back the weights and the
        optimizer state the warm-ups changed."""
        start, trainer = time.perf_counter(), self.trainer
        saved = snapshot(trainer.optimizer)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
            for _ in range(WARMUP_UPDATES):
                self.update(static)
                trainer.optimizer.zero_grad(set_to_none=True)
        torch.cuda.current_stream().wait_stream(self.stream)
        static.graph = torch.cuda.CUDAGraph()
        trainer.optimizer.zero_grad(set_to_none=True)  # backward allocates the grads from the graph's pool
        with torch.cuda.graph(static.graph, stream=self.stream):
            static.loss = self.update(static)
        restore(trainer.optimizer, saved)
        torch.cuda.synchronize(trainer.device)
        self.capture_s += time.perf_counter() - start
        return static

    def run(self, static: Static) -> None:
        """One update on `static`'s buffers: the bucket's graph replayed (it rewrites static.loss)."""
        static.graph.replay()


def capturable_adamw(trainer: Trainer) -> None:
    """Replace the trainer's optimizer by the same AdamW, fused and capturable, its learning rate a device tensor
    that the trainer's schedule fills after each step."""
    cfg, device = trainer.cfg, trainer.device
    groups = [{"params": g["params"], "lr": torch.tensor(g["initial_lr"], device=device),
               "initial_lr": g["initial_lr"]} for g in trainer.optimizer.param_groups]  # a float: the schedule's base
    trainer.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=1e-8,
                                          weight_decay=cfg.weight_decay, fused=True, capturable=True)
    trainer.scheduler = LambdaLR(trainer.optimizer, lr_schedule(cfg.schedule, cfg.warmup_steps))


def snapshot(optimizer: torch.optim.Optimizer) -> dict[int, Tensor]:
    """A copy of every parameter and optimizer-state tensor, by the tensor's id: `restore` writes it back into the
    same tensor (a graph holds its address)."""
    return {id(t): t.detach().clone() for t in trained_tensors(optimizer)}


def restore(optimizer: torch.optim.Optimizer, saved: dict[int, Tensor]) -> None:
    """Copy `saved` back in place; optimizer state made since the snapshot is zeroed (AdamW's fresh state: step 0,
    both moments 0)."""
    with torch.no_grad():
        for t in trained_tensors(optimizer):
            if id(t) in saved:
                t.copy_(saved[id(t)])
            else:
                t.zero_()


def trained_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters an optimizer updates and the tensors of its state."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    return tensors + [t for state in optimizer.state.values() for t in state.values() if isinstance(t, Tensor)]
