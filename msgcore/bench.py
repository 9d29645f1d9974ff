"""Benchmarks: msgcore against Hugging Face BART at equal dimensions. `python -m msgcore.bench --help`.

What is measured; every measurement runs in a fresh worker process, so that both libraries start equal:
    train     target tokens/s (median over timed steps after warm-up) and peak memory of training steps:
              msgcore's `Transformer` vs transformers' `BartForConditionalGeneration` built with the same
              width, layers, heads, FFN, vocabulary, tied embeddings and dropout, on the same Multi30k
              batches, with the same loss (label-smoothed cross-entropy), optimizer, clipping and dtype
    decode    generated tokens/s, greedy and beam 5, at batch 1 and 64; every output is forced to the same
              length (</s> is forbidden until the last step), so both libraries do identical work
    repeats   training and beam-5 decoding at batch 64, which the targets judge, run `--repeats` times, the libraries
              in turn; the median is reported, beside the ratio of each run
    padding   real tokens / padded slots of token-budget (length-bucketed) batches vs random batches
    mfu       on CUDA: model FLOPs utilisation of training, FLOPs counted analytically (`train_flops`)
    ablation  msgcore with one optimisation turned off (SDPA, KV cache, length bucketing, bf16, beam
              hypotheses sharing their sentence's encoder output, room for the next step in the beam reorder,
              a search step's log-probs computed in place, the beam's top-k in chunks) or on (a static KV
              cache, torch.compile, torch's math SDPA kernel under bf16, fused AdamW on CPU, a fused QKV
              projection), to show what each buys
    profile   where the time of training and beam-5 decoding goes, for both libraries (torch.profiler): the
              share of matrix multiplications, fused attention kernels, other ops and code outside any op
`transformers` is needed for the comparison rows only (`pip install transformers`); the book does not need it.
# Deviation from a like-for-like graph: BART adds a LayerNorm on the embeddings and learned positions, and
# is post-norm; msgcore is pre-norm with sinusoidal positions. Both do the same matrix work.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from msgcore.attention import MultiHeadAttention, attention_math, causal_mask
from msgcore.batching import collate, encode_corpus, example_lengths, padding_efficiency, token_batches
from msgcore.data import load_multi30k
from msgcore import attention as attention_module
from msgcore import generation as generation_module
from msgcore import layers as layers_module
from msgcore.generation import GenerationConfig, beam_search
from msgcore.model import Transformer, TransformerConfig, preset
from msgcore.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from msgcore.options import OneLineParser, device_option, whole
from msgcore.utils import MsgcoreError, atomic_write, device_name, git_commit, keep_freed_memory, resolve_device

H100_BF16_PEAK = 790e12  # FLOP/s on large bf16 matmuls, measured on the lent H100/H200 (see DEVELOPERS.md)


REPORTS_DIR = Path(__file__).resolve().parent.parent / "book" / "benchmarks"  # the committed reports the appendix reads


@dataclass
class BenchConfig:
    device: str = "auto"  # "auto": CUDA when visible, else CPU
    max_tokens: int = 4096  # token budget of a training batch (B * longest length)
    warmup_steps: int = 2  # untimed training steps (and decoding batches) first
    timed_steps: int = 8  # timed training steps; the median tokens/s is reported
    decode_length: int = 30  # every decoding output gets exactly this many tokens, then </s>
    decode_batches: int = 3  # timed batches of 64 sentences
    batch1_sentences: int = 10  # sentences timed one at a time (batch size 1)
    vocab_size: int = 8000  # joint BPE vocabulary of the Multi30k De-En batches
    threads: int = 0  # torch threads on CPU (0 = torch's default)
    repeats: int = 3  # runs of each measurement a target is judged on, msgcore and HF in turn; the median is reported


# ---- data: the same Multi30k batches for every worker ----------------------------------------------------

def multi30k(cfg: BenchConfig):
    """(tokenizer, encoded De->En training set, encoded test2016) with a cached BPE tokenizer."""
    train = load_multi30k("train", sources=("de",), target="en")
    tokenizer = Tokenizer.train(train.texts(), vocab_size=cfg.vocab_size, model_type="bpe")
    test = load_multi30k("test_2016_flickr", sources=("de",), target="en")
    return tokenizer, encode_corpus(train, tokenizer, max_len=128), encode_corpus(test, tokenizer)


def random_batches(lengths: list[int], max_tokens: int, seed: int = 0) -> list[list[int]]:
    """Batches in random order, cut at the token budget without sorting by length (the padding baseline)."""
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    batches, batch, longest = [], [], 0
    for i in order:
        if batch and (len(batch) + 1) * max(longest, lengths[i]) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, lengths[i])
    return batches + ([batch] if batch else [])


# ---- the two libraries -------------------------------------------------------------------------------------

def hf_bart(cfg: TransformerConfig, attention: str = "sdpa"):
    """transformers' BART with msgcore's dimensions, SDPA attention (or `attention`: "eager" is its written-out
    math path) and msgcore's special ids."""
    try:
        from transformers import BartConfig, BartForConditionalGeneration
    except ImportError:
        raise MsgcoreError("the Hugging Face rows need transformers: pip install transformers "
                           "(or run with --skip-hf)") from None
    config = BartConfig(vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
                        decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads,
                        decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                        activation_dropout=cfg.activation_dropout, activation_function="relu",
                        max_position_embeddings=cfg.max_positions, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
                        eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID, forced_eos_token_id=None,
                        tie_word_embeddings=cfg.tie_embeddings)
    return BartForConditionalGeneration._from_config(config, attn_implementation=attention)


def summed_loss(library: str, model, batch) -> torch.Tensor:
    """Label-smoothed cross-entropy summed over real target tokens, the same for both libraries.

    BART gets no decoder padding mask: padding sits at the end, so the causal mask already keeps it away
    from real positions, and without it BART can take SDPA's fast causal path, as msgcore does.
    """
    if library == "msgcore":
        return model.loss(batch, label_smoothing=0.1)
    logits = model(input_ids=batch.sources[0], attention_mask=batch.source_masks[0],
                   decoder_input_ids=batch.target_in).logits  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.target_out.flatten(), ignore_index=PAD_ID,
                           reduction="sum", label_smoothing=0.1)


def build(library: str, preset_name: str, vocab_size: int, device: torch.device, hf_attention: str = "sdpa"):
    torch.manual_seed(0)
    cfg = preset(preset_name, vocab_size=vocab_size, dropout=0.1)
    model = Transformer(cfg) if library == "msgcore" else hf_bart(cfg, hf_attention)
    return cfg, model.to(device)


# ---- measurements (run inside a worker) ---------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident_mb() -> float:
    """The process's resident memory now (Linux), MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb(device: torch.device, baseline: float) -> float:
    """Peak memory of the steps: CUDA's allocator peak, or on CPU the growth of the peak resident size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - baseline


def train_flops(cfg: TransformerConfig, batch) -> float:
    """Matmul FLOPs of one training step on a padded batch: 3 x forward (backward = 2 x forward).

    Every linear layer costs 2 * in * out per position, attention 2 * 2 * T * S * D per layer (causal
    attention counted in full); embedding lookups, norms and softmax are left out.
    """
    B, S, T = batch.sources[0].size(0), batch.sources[0].size(1), batch.target_in.size(1)
    D, Fd, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    encoder = cfg.encoder_layers * (2 * B * S * (4 * D * D + 2 * D * Fd) + 4 * B * S * S * D)
    decoder = cfg.decoder_layers * (2 * B * T * (4 * D * D + 2 * D * D + 2 * D * Fd) + 2 * B * S * 2 * D * D
                                    + 4 * B * T * T * D + 4 * B * T * S * D)
    return 3.0 * (encoder + decoder + 2 * B * T * D * V)


def torch_loss(model, batch, label_smoothing: float = 0.0) -> torch.Tensor:
    """Transformer.loss through torch's F.cross_entropy over an fp32 copy of the logits (the "loss" ablation)."""
    logits = model(batch)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.target_out.flatten(), ignore_index=model.cfg.pad_id,
                           reduction="sum", label_smoothing=label_smoothing)


def torch_dropout(self, x):
    """msgcore.layers.Dropout as torch's own (one Bernoulli draw per element on a CPU): the dropout ablation."""
    return torch.nn.functional.dropout(x, self.p, self.training)


def math_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **_):
    """SDPA's signature over msgcore's written-out attention (the "math path" ablation)."""
    if is_causal:
        attn_mask = causal_mask(q.size(-2), k.size(-2), q.device)
    return attention_math(q, k, v, attn_mask, dropout_p)[0]


def kernels(spec: dict):
    """torch's SDPA kernels a spec asks for (its "sdpa_backends", as TrainConfig.sdpa_backends), else torch's choice."""
    import contextlib

    from msgcore.trainer import Trainer

    names = spec.get("sdpa_backends")
    return sdpa_kernel(Trainer.resolve_sdpa_backends(names)) if names else contextlib.nullcontext()


def training_batches(spec: dict, cfg: BenchConfig, lengths: list[int]) -> list[list[int]]:
    """The batches (example indices) of a training measurement: length-bucketed, or random for that ablation, at
    the spec's token budget (the "token budget" ablation rows) or the config's."""
    budget = spec.get("max_tokens", cfg.max_tokens)
    if spec.get("batching") == "random":
        return random_batches(lengths, budget)
    return token_batches(lengths, budget, shuffle=True, seed=0)


def train_worker(spec: dict, cfg: BenchConfig) -> dict:
    device = resolve_device(cfg.device)
    tokenizer, train, _ = multi30k(cfg)
    lengths = example_lengths(train)
    index = training_batches(spec, cfg, lengths)
    batches = [collate(train, b).to(device) for b in index[:cfg.warmup_steps + cfg.timed_steps]]
    model_cfg, model = build(spec["library"], spec["preset"], tokenizer.vocab_size, device,
                             spec.get("hf_attention", "sdpa"))
    if spec.get("attention") == "math":
        torch.nn.functional.scaled_dot_product_attention = math_sdpa  # this worker only runs msgcore
    if spec.get("qkv") == "fused":
        MultiHeadAttention.queries_keys_values = fused_queries_keys_values  # likewise
    if spec.get("loss") == "torch":
        Transformer.loss = torch_loss  # likewise
    if spec.get("dropout") == "torch":
        layers_module.Dropout.forward = torch_dropout  # likewise
    if spec.get("compile"):
        model.compile()  # in place, so that model.loss -> model(batch) runs the compiled forward
    model.train()
    fused = spec.get("fused_adamw", device.type == "cuda")  # as the Trainer: fused on CUDA, for-loop on CPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), fused=fused)
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else None
    baseline = resident_mb()
    rates, flops, seconds, first_step = [], 0.0, 0.0, 0.0
    profiler = step_profiler(spec)
    for step, batch in enumerate(batches):
        if step == cfg.warmup_steps and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if step == cfg.warmup_steps and profiler:
            profiler.start()
        sync(device)
        start = time.perf_counter()
        with kernels(spec):  # the backward pass runs on the same kernels as the forward
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = summed_loss(spec["library"], model, batch) / batch.num_target_tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        elapsed = time.perf_counter() - start
        first_step = first_step or elapsed  # includes compilation under torch.compile
        if step >= cfg.warmup_steps:
            rates.append(batch.num_target_tokens / elapsed)
            flops, seconds = flops + train_flops(model_cfg, batch), seconds + elapsed
    if profiler:
        profiler.stop()
        return time_shares(profiler, seconds, cfg.timed_steps)
    row = {"target tokens/s": statistics.median(rates), "peak memory (MB)": peak_mb(device, baseline),
           "parameters (M)": sum(p.numel() for p in model.parameters()) / 1e6,
           "model TFLOP/s": flops / seconds / 1e12,
           "padding efficiency": padding_efficiency(index[:len(batches)], lengths), "first step (s)": first_step}
    return row


def msgcore_generation_config(beam: int, length: int) -> GenerationConfig:
    """`length` tokens and then </s> (with </s> forbidden, it can only come at the length limit)."""
    return GenerationConfig(beam_size=beam, max_len_a=0.0, max_len_b=length + 1, min_len=1)


def generation(library: str, model, beam: int, length: int):
    """A function sources, masks -> output ids that forces `length` tokens and then </s>."""
    if library == "msgcore":
        config = msgcore_generation_config(beam, length)
        return lambda src, mask: model.generate([src], [mask], BOS_ID, EOS_ID, config,
                                                forbidden=[PAD_ID, BOS_ID, EOS_ID])  # </s> only at the limit
    from transformers import GenerationConfig as HFGenerationConfig

    config = HFGenerationConfig(num_beams=beam, max_new_tokens=length + 1, min_new_tokens=length + 1,
                                do_sample=False, early_stopping=False, no_repeat_ngram_size=0, length_penalty=1.0,
                                decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                                pad_token_id=PAD_ID)
    return lambda src, mask: model.generate(input_ids=src, attention_mask=mask, generation_config=config)


class PerHypothesisMemory:
    """A model whose encoder output is repeated once per beam hypothesis (the "memory per hypothesis" ablation):
    beam search as it ran before cross-attention let a sentence's hypotheses share one memory row."""

    def __init__(self, model, beam: int):
        self.model, self.beam = model, beam

    def encode(self, sources, source_masks):
        rows = torch.arange(sources[0].size(0), device=sources[0].device).repeat_interleave(self.beam)
        return [m.index_select(rows) for m in self.model.encode(sources, source_masks)]

    def decode(self, *args, **kwargs):
        return self.model.decode(*args, **kwargs)


THREE_PROJECTIONS = MultiHeadAttention.queries_keys_values  # msgcore's own, kept before the ablation patches it


def fused_queries_keys_values(attention: MultiHeadAttention, x, memory, cache):
    """MultiHeadAttention.queries_keys_values with one x [W^Q; W^K; W^V] GEMM for uncached self-attention
    (the "fused QKV projection" ablation); the same parameters, concatenated at each call."""
    if memory is not None or cache is not None:
        return THREE_PROJECTIONS(attention, x, memory, cache)
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    weight = torch.cat([p.weight for p in projections])  # (3D, D)
    bias = torch.cat([p.bias for p in projections]) if attention.q_proj.bias is not None else None
    return tuple(attention.split_heads(part) for part in F.linear(x, weight, bias).chunk(3, dim=-1))


class StaticKVCache:
    """The "static KV cache" ablation: beam search's self-attention keys and values live in pairs of preallocated
    buffers, `block` positions per row at a time, and each reorder copies the rows from one buffer of the pair into
    the other, so no step allocates a buffer the size of the whole cache (the layout a CUDA-graph decoder step
    needs). `reorder` replaces layers.reorder_with_room, `append_into_room` attention.append_to_cache."""

    def __init__(self, block: int = 32):
        self.block, self.partner = block, {}  # storage address of one buffer -> the other buffer of its pair

    def reorder(self, cached: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        (_, H, t, Dh), n = cached.shape, index.numel()
        target = self.partner.get(cached.untyped_storage().data_ptr())
        if target is None or target.size(2) < t + 1 or target.size(0) < n:  # a new pair, with room for more steps
            C = -(-(t + 1) // self.block) * self.block
            first, second = (cached.new_empty(n, H, C, Dh) for _ in range(2))
            self.partner.update({first.untyped_storage().data_ptr(): second,
                                 second.untyped_storage().data_ptr(): first})
            target = first
        reordered = target[:n, :, :t]  # (n, H, t, Dh), strides of the (n', H, C, Dh) buffer
        torch.index_select(cached, 0, index, out=reordered)
        return reordered

    def searching(self, translate):
        """`translate` that lets go of every buffer when it returns."""
        def run(src, mask):
            try:
                return translate(src, mask)
            finally:
                self.partner.clear()
        return run


def append_into_room(cached: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """attention.append_to_cache for a cache at the start of a (B, H, C, Dh) buffer with any C >= t + T."""
    B, H, t, Dh = cached.shape
    C = cached.stride(1) // Dh
    room = (cached.stride() == (H * C * Dh, C * Dh, Dh, 1) and C >= t + new.size(2) and cached.storage_offset() == 0
            and cached.untyped_storage().nbytes() >= B * H * C * Dh * cached.element_size())
    if not room or getattr(cached, "room_taken", False):
        return torch.cat([cached, new], dim=2)
    cached.room_taken = True
    extended = cached.as_strided((B, H, t + new.size(2), Dh), cached.stride())
    extended[:, :, t:] = new
    return extended


def step_log_probs_in_a_new_tensor(model, tokens, memory, cache, step: int):
    """generation.step_log_probs with log_softmax into a new (N, V) tensor (the "new tensors" ablation)."""
    out = model.decode(tokens[:, -1:], memory, cache, start_pos=step)
    return torch.log_softmax(out.logits[:, -1].float(), dim=-1), out.cache


def candidates_in_a_new_tensor(scores: torch.Tensor, logp: torch.Tensor, n: int):
    """generation.best_candidates adding the beam scores into a new (B, k*V) tensor (the same ablation)."""
    B, k = scores.shape
    V = logp.size(-1)
    cand_scores, index = generation_module.topk_in_chunks((scores.view(-1, 1) + logp).view(B, k * V), n)  # (B, n)
    return cand_scores, index // V, index % V


def keep_done_sentences(done: list[bool]) -> list[int] | None:
    """generation.sentences_to_keep that drops no sentence until all are done (the "done sentences stay" ablation):
    beam search as it ran before a done sentence left the batch."""
    return [] if all(done) else None


@torch.no_grad()
def greedy_without_cache(model, src, mask, length: int):
    """Greedy search that re-runs the decoder over the whole prefix at every step (the "no KV cache" ablation)."""
    memory = model.encode([src], [mask])
    tokens = torch.full((src.size(0), 1), BOS_ID, dtype=torch.long, device=src.device)
    for _ in range(length + 1):
        next_token = model.decode(tokens, memory).logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], 1)
    return tokens


def decode_worker(spec: dict, cfg: BenchConfig) -> dict:
    device = resolve_device(cfg.device)
    tokenizer, _, test = multi30k(cfg)
    _, model = build(spec["library"], spec["preset"], tokenizer.vocab_size, device)
    model.eval()
    translate = generation(spec["library"], model, spec["beam"], cfg.decode_length)
    if spec.get("cache") is False:
        translate = lambda src, mask: greedy_without_cache(model, src, mask, cfg.decode_length)  # noqa: E731
    if spec.get("memory") == "per hypothesis":
        translate = lambda src, mask: beam_search(PerHypothesisMemory(model, spec["beam"]), [src], [mask],  # noqa: E731
                                                  BOS_ID, EOS_ID, msgcore_generation_config(spec["beam"], cfg.decode_length),
                                                  forbidden=[PAD_ID, BOS_ID, EOS_ID])
    if spec.get("step tensors") == "new":  # this worker's searches allocate two (N, V) tensors per step
        generation_module.step_log_probs = step_log_probs_in_a_new_tensor
        generation_module.best_candidates = candidates_in_a_new_tensor
    if spec.get("topk") == "one pass":
        generation_module.topk_in_chunks = lambda x, n: x.topk(n, dim=1)
    if spec.get("reorder") == "compact":
        layers_module.reorder_with_room = lambda kv, index: kv.index_select(0, index)  # no room: appending copies
    if spec.get("reorder") == "static":
        static = StaticKVCache()
        layers_module.reorder_with_room, attention_module.append_to_cache = static.reorder, append_into_room
        translate = static.searching(translate)
    lengths = None
    if spec.get("lengths") == "source":  # each output as long as its source allows: the sentences end apart
        lengths = GenerationConfig(beam_size=spec["beam"], max_len_a=1.2, max_len_b=10, min_len=1)
        translate = lambda src, mask: model.generate([src], [mask], BOS_ID, EOS_ID, lengths,  # noqa: E731
                                                     forbidden=[PAD_ID, BOS_ID, EOS_ID])  # </s> only at the limit
    if spec.get("done sentences") == "kept":
        generation_module.sentences_to_keep = keep_done_sentences
    size = spec["batch"]
    n = cfg.batch1_sentences if size == 1 else cfg.decode_batches
    groups = [list(range(i * size, (i + 1) * size)) for i in range(cfg.warmup_steps + n)]
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else None
    times, rates = [], []
    profiler = step_profiler(spec)
    for i, group in enumerate(groups):
        batch = collate(test, group).to(device)
        if i == cfg.warmup_steps and profiler:
            profiler.start()
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            translate(batch.sources[0], batch.source_masks[0])
        sync(device)
        if i >= cfg.warmup_steps:
            times.append(time.perf_counter() - start)
            if lengths:  # the tokens this batch generated, </s> included
                rates.append(generation_module.max_lengths(batch.source_masks, lengths).sum().item() / times[-1])
    if profiler:
        profiler.stop()
        return time_shares(profiler, sum(times), len(times))
    if lengths:
        return {"generated tokens/s": statistics.median(rates)}
    return {"generated tokens/s": size * (cfg.decode_length + 1) / statistics.median(times)}


# ---- where the time goes: the share of matrix multiplication ---------------------------

MATMUL_SHAPES = ((2048, 2048, 2048), (4096, 256, 1024), (4096, 1024, 256), (4096, 256, 8000))  # (M, K, N): a large
# square, and the `small` preset's own products (a token batch times the FFN, its projection back, the vocabulary)


def peak_worker(spec: dict, cfg: BenchConfig) -> dict:
    """The hardware's sustained matmul throughput in the spec's dtype, at the bench's thread count: torch.mm at
    each MATMUL_SHAPES, the median of 10 timed products after 3 warm-up ones. The best shape is the peak that
    CPU MFU divides by."""
    device = resolve_device(cfg.device)
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    by_shape = {}
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        times = []
        for rep in range(13):
            sync(device)
            start = time.perf_counter()
            torch.mm(a, b)
            sync(device)
            if rep >= 3:
                times.append(time.perf_counter() - start)
        by_shape[f"{m}x{k}x{n}"] = 2 * m * k * n / statistics.median(times) / 1e9
    return {"GFLOP/s by shape": by_shape, "sustained GFLOP/s": max(by_shape.values())}


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


TOP_OPS = 12  # ops listed per profile, by their own time
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")


def step_profiler(spec: dict):
    """A CPU torch.profiler for the timed steps of a "profile" spec (started and stopped by the worker), else None."""
    if spec["kind"] != "profile":
        return None
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def time_shares(profiler, seconds: float, steps: int = 1) -> dict:
    """Shares of the timed steps' wall time: matrix multiplications, fused attention kernels, every other op,
    and the rest (Python and framework code outside any op); the ops with the most time of their own; and the
    wall time of one step, so that the shares convert to milliseconds per step."""
    events = [e for e in profiler.key_averages() if e.self_cpu_time_total > 0]
    def share(keep):
        return sum(e.self_cpu_time_total for e in events if keep(e.key)) / 1e6 / seconds

    matmul = share(lambda key: key in MATMUL_OPS)
    attention = share(lambda key: "scaled_dot_product" in key or "flash_attention" in key)
    ops = share(lambda key: True)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:TOP_OPS]
    return {"matmul share": matmul, "fused attention share": attention, "other ops share": ops - matmul - attention,
            "outside ops share": max(0.0, 1 - ops), "seconds per step": seconds / steps,
            "top ops": [[e.key, e.self_cpu_time_total / 1e6 / seconds] for e in top]}


def op_rows(rows: list[dict]) -> list[dict]:
    """Milliseconds per training step in each of the ops that take the most time, msgcore beside HF (same batches):
    whether msgcore's time outside the matrix multiplications goes to the same ops as HF's, at the same cost."""
    profiles = {(r["preset"], r["library"]): r for r in rows
                if r["kind"] == "profile" and r["of"] == "train" and r.get("setting") != "book"}
    out = []
    for preset_name in dict.fromkeys(p for p, _ in profiles):
        per_step = {lib: {op: share * r["seconds per step"] * 1e3 for op, share in r["top ops"]}
                    for (p, lib), r in profiles.items() if p == preset_name and "seconds per step" in r}
        if set(per_step) != {"msgcore", "hf"}:
            continue
        for op in dict.fromkeys([*per_step["msgcore"], *per_step["hf"]]):
            ours, theirs = per_step["msgcore"].get(op), per_step["hf"].get(op)
            out.append({"preset": preset_name, "op": op, "msgcore (ms/step)": rounded(ours, 1),
                        "HF (ms/step)": rounded(theirs, 1), "msgcore / HF": rounded(ours / theirs, 2) if ours and theirs else None})
    return out


# ---- the plan, the workers and the report ------------------------------------------------------------------

BOOK_SETTING = "bf16 autocast + torch's math SDPA kernel (against bf16 autocast)"  # the chapters' CPU setting
SOURCE_LENGTHS = "each output as long as its source allows (1.2 |x| + 10 tokens), so the sentences end apart"


def plan(presets: list[str], device: torch.device, skip_hf: bool, with_compile: bool) -> list[dict]:
    """Every measurement as a spec: kind, library, preset, dtype and the knobs of the ablations."""
    dtype = "bf16" if device.type == "cuda" else "fp32"
    libraries = ["msgcore"] if skip_hf else ["msgcore", "hf"]
    specs = [dict(kind="peak", library="torch", preset="-", dtype=d) for d in ("fp32", "bf16")]  # what MFU divides by
    specs += [dict(kind="train", library=lib, preset=p, dtype=dtype) for p in presets for lib in libraries]
    specs += [dict(kind="decode", library=lib, preset=p, dtype=dtype, beam=beam, batch=batch)
              for p in presets for beam in (1, 5) for batch in (1, 64) for lib in libraries]
    first = presets[0]
    ablation = dict(library="msgcore", preset=first, dtype=dtype)
    specs += [dict(kind="train", **ablation, attention="math", ablation="math attention instead of SDPA"),
              dict(kind="train", **ablation, batching="random", ablation="random batches instead of length buckets"),
              dict(kind="train", **ablation, qkv="fused", ablation="one fused QKV projection for self-attention"),
              dict(kind="train", **{**ablation, "dtype": "fp32" if dtype == "bf16" else "bf16"},
                   ablation="fp32" if dtype == "bf16" else "bf16 autocast"),
              dict(kind="decode", **ablation, beam=1, batch=64, cache=False,
                   ablation="no KV cache (greedy re-runs the prefix)"),
              dict(kind="decode", **ablation, beam=5, batch=64, memory="per hypothesis",
                   ablation="encoder output repeated per hypothesis (cross-attention K/V per beam)"),
              dict(kind="decode", **ablation, beam=5, batch=64, reorder="compact",
                   ablation="beam reorder leaves no room (the next step's append copies the cache again)"),
              dict(kind="decode", **ablation, beam=5, batch=64, reorder="static",
                   ablation="static KV cache: the reorder alternates between two preallocated buffers"),
              dict(kind="decode", **ablation, beam=5, batch=64, **{"step tensors": "new"},
                   ablation="log-probs and candidate scores in new (N, V) tensors at every step"),
              dict(kind="decode", **ablation, beam=5, batch=64, topk="one pass",
                   ablation="one torch.topk over all k*V candidates (not the best chunks first)"),
              dict(kind="decode", **ablation, beam=5, batch=64, lengths="source", ablation=SOURCE_LENGTHS),
              dict(kind="decode", **ablation, beam=5, batch=64, lengths="source", against=SOURCE_LENGTHS,
                   **{"done sentences": "kept"},
                   ablation="done sentences stay in the beam batch (against outputs as long as their sources)")]
    specs += [dict(kind="train", **ablation, max_tokens=budget,
                   ablation=f"token budget of {budget:,} per batch (not {BenchConfig.max_tokens:,})")
              for budget in (1024, 2048, 8192)]
    if device.type == "cpu":  # on CUDA the Trainer's AdamW is already fused
        specs.append(dict(kind="train", **ablation, fused_adamw=True, ablation="AdamW fused=True (CPU kernel)"))
    specs += [dict(kind="profile", of=of, library=lib, preset=p, dtype=dtype, **extra)
              for p in presets for of, extra in (("train", {}), ("decode", {"beam": 5, "batch": 64}))
              for lib in libraries]
    specs.append(dict(kind="train", **ablation, loss="torch",
                      ablation="loss by F.cross_entropy over fp32 logits (not msgcore.loss's row chunks)"))
    if dtype == "fp32":  # on a CPU the chapters train under bf16 autocast: what torch's math kernel buys there
        book = dict(kind="train", **{**ablation, "dtype": "bf16"}, sdpa_backends=["math"])
        specs.append(dict(**book, against="bf16 autocast", ablation=BOOK_SETTING))
        specs.append(dict(**book, loss="torch", against=BOOK_SETTING,
                          ablation="loss by F.cross_entropy over fp32 logits (against the book's CPU setting: "
                                   "bf16 autocast + the math kernel)"))
        specs.append(dict(**book, dropout="torch", against=BOOK_SETTING,
                          ablation="torch's dropout, one Bernoulli draw per element (against the book's CPU setting)"))
        specs.append(dict(**book, allocator="default", against=BOOK_SETTING,
                          ablation="the allocator's default: freed large tensors go back to the OS (against the "
                                   "book's CPU setting)"))
    if dtype == "fp32" and not skip_hf:  # both libraries in the chapters' CPU setting, HF in its best one
        specs += book_setting_specs(first)
    if dtype == "fp32":  # where the chapters' CPU training spends its time: the presets their `small` recipes train
        specs += [dict(kind="profile", of="train", library="msgcore", preset=p, dtype="bf16", sdpa_backends=["math"],
                       setting="book") for p in BOOK_PRESETS]
    if with_compile:
        specs.append(dict(kind="train", **ablation, compile=True, ablation="torch.compile"))
    return specs


BOOK_PRESETS = ("small", "tiny")  # the presets the chapters' `small` recipes train (chapters 0 and 2; 1 and 3-5)
HF_CPU_ATTENTION = ("sdpa", "eager")  # transformers' attention implementations tried under bf16 on a CPU


def book_setting_specs(preset_name: str) -> list[dict]:
    """Training in the book's CPU setting: msgcore with bf16 autocast and the math kernel, HF with bf16 autocast and
    each of its attention implementations (its best one is the one compared)."""
    book = dict(kind="train", preset=preset_name, dtype="bf16", setting="book")
    return [dict(**book, library="msgcore", sdpa_backends=["math"]),
            *[dict(**book, library="hf", hf_attention=name) for name in HF_CPU_ATTENTION]]


def run_worker(spec: dict, cfg: BenchConfig) -> dict:
    """Run one measurement in a fresh Python process and return its row."""
    command = [sys.executable, "-m", "msgcore.bench", "--worker", json.dumps({"spec": spec, "cfg": asdict(cfg)})]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise MsgcoreError(f"benchmark worker {spec} failed: {done.stderr.strip().splitlines()[-1]}")
    return {**spec, **json.loads(done.stdout.strip().splitlines()[-1])}


def judged_by_a_target(spec: dict) -> bool:
    """The measurements the targets are judged on: training, and beam-5 decoding at batch 64 (no ablation)."""
    return "ablation" not in spec and (spec["kind"] == "train"
                                       or (spec["kind"] == "decode" and spec["beam"] == 5 and spec["batch"] == 64))


def repeated(spec: dict) -> bool:
    """The measurements that run cfg.repeats times: those a target judges, and the beam-search ablations (one run of
    a decoding ablation moves by up to 10 % on a shared CPU, as much as most of them change)."""
    return judged_by_a_target(spec) or (spec["kind"] == "decode" and "ablation" in spec and spec.get("beam") == 5)


def repeat_target_measurements(measured: list[tuple[dict, dict]], cfg: BenchConfig) -> None:
    """Run each `repeated` measurement cfg.repeats - 1 more times, all of them in turn (so msgcore and HF, and an
    ablation and its baseline, alternate), keep every run in the row ("runs") and report the median: a ratio moves
    between runs on a shared machine, and the report shows by how much."""
    targets = [(spec, row) for spec, row in measured if repeated(spec)]
    for repeat in range(cfg.repeats - 1):
        for spec, row in targets:
            row.setdefault("runs", [row[_metric(row)]]).append(run_worker(spec, cfg)[_metric(row)])
            print(f"repeat {repeat + 2}/{cfg.repeats} of {spec}: {row['runs'][-1]:.4g}", flush=True)
    for _, row in targets:
        if "runs" in row:
            row[_metric(row)] = statistics.median(row["runs"])


def ratios(rows: list[dict]) -> list[dict]:
    """msgcore / HF for every measurement both libraries ran, with the ratio of each repeated run (run i of msgcore
    over run i of HF) where the measurement was repeated."""
    out = []
    for row in rows:
        measured = (row["library"] == "msgcore" and "ablation" not in row and "setting" not in row
                    and row["kind"] in ("train", "decode"))
        twin = _twin(rows, row, library="hf") if measured else None
        if twin and "ablation" not in twin:
            metric = _metric(row)
            out.append({"kind": row["kind"], "preset": row["preset"], "beam": row.get("beam"),
                        "batch": row.get("batch"), "msgcore": row[metric], "hf": twin[metric],
                        "ratio msgcore/hf": row[metric] / twin[metric]})
            if len(row.get("runs", ())) > 1 and len(row["runs"]) == len(twin.get("runs", ())):
                out[-1]["ratio of each run"] = [ours / theirs for ours, theirs in zip(row["runs"], twin["runs"])]
    return out + book_setting_ratio(rows)


def book_setting_ratio(rows: list[dict]) -> list[dict]:
    """msgcore in the book's CPU setting over HF in its fastest bf16 setting (its attention implementations)."""
    ours = next((r for r in rows if r.get("setting") == "book" and r["library"] == "msgcore"), None)
    theirs = [r for r in rows if r.get("setting") == "book" and r["library"] == "hf"]
    if not ours or not theirs:
        return []
    best = max(theirs, key=lambda r: r["target tokens/s"])
    out = {"kind": "train", "preset": ours["preset"], "beam": None, "batch": None, "setting": "book",
           "hf setting": f"bf16 autocast, attention {best['hf_attention']}", "msgcore": ours["target tokens/s"],
           "hf": best["target tokens/s"], "ratio msgcore/hf": ours["target tokens/s"] / best["target tokens/s"]}
    if len(ours.get("runs", ())) > 1 and len(ours["runs"]) == len(best.get("runs", ())):
        out["ratio of each run"] = [a / b for a, b in zip(ours["runs"], best["runs"])]
    return [out]


def environment(device: torch.device, cfg: BenchConfig) -> dict:
    try:
        import transformers
        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    return {"device": device_name(device), "torch": torch.__version__, "transformers": hf_version,
            "git commit": git_commit(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": asdict(cfg)}


TARGETS = {"train": 1.3, "decode": 2.0, "mfu": 0.35}  # issue #5: msgcore/HF training and beam-5 decoding, GPU MFU


def _metric(row: dict) -> str:
    return "target tokens/s" if row["kind"] == "train" else "generated tokens/s"


def _twin(rows: list[dict], row: dict, **match) -> dict | None:
    """The row measured like `row` (same kind, preset, beam, batch and setting) that also matches `match`."""
    keys = ("kind", "preset", "beam", "batch", "setting")
    return next((r for r in rows if all(r.get(k) == row.get(k) for k in keys)
                 and all(r.get(k) == v for k, v in match.items())), None)


def setting_name(row: dict) -> str:
    """How a training row ran: its dtype, or the book's CPU setting (with HF's attention implementation)."""
    if row.get("setting") != "book":
        return row["dtype"]
    if row["library"] == "msgcore":
        return "bf16 + math kernel (the book's)"
    return f"bf16, {row['hf_attention']} attention"


def train_rows(rows: list[dict]) -> list[dict]:
    return [{"library": r["library"], "preset": r["preset"], "setting": setting_name(r),
             "target tokens/s": round(r["target tokens/s"]), "peak memory (MB)": round(r["peak memory (MB)"]),
             "parameters (M)": round(r["parameters (M)"], 1), "model TFLOP/s": round(r["model TFLOP/s"], 3),
             "first step (s)": round(r.get("first step (s)", float("nan")), 1)} for r in rows if r["kind"] == "train"]


def decode_rows(rows: list[dict]) -> list[dict]:
    return [{"library": r["library"], "preset": r["preset"], "dtype": r["dtype"], "beam": r["beam"],
             "batch": r["batch"], "generated tokens/s": round(r["generated tokens/s"])}
            for r in rows if r["kind"] == "decode"]


def ratio_rows(ratios_: list[dict]) -> list[dict]:
    return [{"measurement": r["kind"] + ("" if r["kind"] == "train" else f", beam {r['beam']}, batch {r['batch']}")
             + (f" in the book's setting (HF: {r['hf setting']})" if r.get("setting") == "book" else ""),
             "preset": r["preset"], "msgcore": round(r["msgcore"]), "Hugging Face": round(r["hf"]),
             "msgcore / HF": round(r["ratio msgcore/hf"], 2), "ratio of each run": run_range(r)} for r in ratios_]


def run_range(ratio: dict) -> str:
    """'lowest-highest (n runs)' of a repeated measurement's per-run ratios, '' for one run."""
    each = ratio.get("ratio of each run")
    return f"{min(each):.2f}-{max(each):.2f} ({len(each)} runs)" if each else ""


def ablation_rows(rows: list[dict], plain: list[dict]) -> list[dict]:
    """Each ablation against msgcore's row measured the same way without it."""
    out = []
    for r in rows:
        base = _twin(plain, r, library="msgcore") if "ablation" in r else None
        if "against" in r:  # a change on top of another ablation is measured against that ablation's row
            base = next((x for x in rows if x.get("ablation") == r["against"]), None)
        if base:
            metric = _metric(r)
            out.append({"measurement": r["kind"], "preset": r["preset"], "change": r["ablation"],
                        "msgcore as is": round(base[metric]), "with the change": round(r[metric]),
                        "speed with / without the change": round(r[metric] / base[metric], 2),
                        "first step (s)": round(r["first step (s)"], 1) if "first step (s)" in r else None})
    return out


def target_rows(report: dict) -> list[dict]:
    """Each target of TARGETS against what was measured."""
    out = []
    for r in report["ratios"]:
        if r["kind"] == "train" or r["beam"] == 5:
            goal = TARGETS[r["kind"]]
            what = "training" if r["kind"] == "train" else f"beam-5 decoding, batch {r['batch']}"
            what += " in the book's CPU setting" if r.get("setting") == "book" else ""
            each = r.get("ratio of each run", [r["ratio msgcore/hf"]])
            out.append({"target": f"{what} ({r['preset']}): msgcore >= {goal}x HF",
                        "measured": f"{r['ratio msgcore/hf']:.2f}x", "each run": run_range(r),
                        "met": r["ratio msgcore/hf"] >= goal, "met in every run": min(each) >= goal})
    for name, mfu in report.get("mfu", {}).items():
        out.append({"target": f"MFU of {name} training >= {TARGETS['mfu']:.0%}", "measured": f"{mfu:.1%}",
                    "met": mfu >= TARGETS["mfu"]})
    return out


def tables(report: dict) -> dict:
    """The report as pandas tables: train, decode, ratios, ablations, padding, targets, profile and training ops."""
    import pandas as pd

    rows = report["rows"]
    plain = [r for r in rows if "ablation" not in r]
    return {"matmul peak": pd.DataFrame(peak_rows(rows)), "hardware use": pd.DataFrame(mfu_rows(report)),
            "train": pd.DataFrame(train_rows(plain)), "decode": pd.DataFrame(decode_rows(plain)),
            "ratios": pd.DataFrame(ratio_rows(report["ratios"])), "ablations": pd.DataFrame(ablation_rows(rows, plain)),
            "padding": pd.DataFrame([report["padding"]]), "targets": pd.DataFrame(target_rows(report)),
            "profile": pd.DataFrame(profile_rows(rows)), "training ops": pd.DataFrame(op_rows(rows))}


def peak_rows(rows: list[dict]) -> list[dict]:
    """The sustained torch.mm throughput per dtype and shape (the "peak" rows)."""
    return [{"dtype": r["dtype"], **{f"{shape} (GFLOP/s)": round(v) for shape, v in r["GFLOP/s by shape"].items()},
             "sustained (GFLOP/s)": round(r["sustained GFLOP/s"])} for r in rows if r["kind"] == "peak"]


def mfu_rows(report: dict) -> list[dict]:
    """CPU MFU: msgcore's training FLOP/s as a share of the matmul peak in the same dtype, for the plain rows and for
    the book's CPU setting (bf16 autocast + the math kernel: its repeated row, else its ablation row)."""
    peak, rows = report.get("peak", {}), report["rows"]
    book_row = any(r.get("setting") == "book" and r["library"] == "msgcore" for r in rows)
    out = []
    for r in rows:
        if r["kind"] != "train" or r["library"] != "msgcore" or r["dtype"] not in peak:
            continue
        if "ablation" in r and (r["ablation"] != BOOK_SETTING or book_row):
            continue
        book = "ablation" in r or r.get("setting") == "book"
        out.append({"preset": r["preset"], "setting": "bf16 autocast + math kernel (the book's)" if book
                    else r["dtype"], "model TFLOP/s": round(r["model TFLOP/s"], 3),
                    "matmul peak (TFLOP/s)": round(peak[r["dtype"]] / 1e3, 3),
                    "MFU": f"{r['model TFLOP/s'] * 1e3 / peak[r['dtype']]:.0%}"})
    return out


def profile_rows(rows: list[dict]) -> list[dict]:
    """Where the time of the timed steps goes, per library (the "profile" rows)."""
    return [{"library": r["library"], "preset": r["preset"], "setting": setting_name(r),
             "measurement": "train" if r["of"] == "train" else f"decode, beam {r['beam']}, batch {r['batch']}",
             "matmul": f"{r['matmul share']:.0%}", "fused attention": f"{r['fused attention share']:.0%}",
             "other ops": f"{r['other ops share']:.0%}", "outside ops": f"{r['outside ops share']:.0%}",
             "top op": f"{r['top ops'][0][0]} ({r['top ops'][0][1]:.0%})"} for r in rows if r["kind"] == "profile"]


def markdown(report: dict) -> str:
    """The report as markdown tables."""
    env = report["environment"]
    lines = [f"Device: {env['device']}; torch {env['torch']}, transformers {env['transformers']}, "
             f"commit {env['git commit']}, {env['date']}.", ""]
    for name, table in tables(report).items():
        if len(table):
            lines += [f"### {name}", "", table.to_markdown(index=False), ""]
    return "\n".join(lines)


def padding_report(cfg: BenchConfig) -> dict:
    _, train, _ = multi30k(cfg)
    lengths = example_lengths(train)
    bucketed = token_batches(lengths, cfg.max_tokens, shuffle=True, seed=0)
    shuffled = random_batches(lengths, cfg.max_tokens)
    return {"max tokens": cfg.max_tokens, "length-bucketed": padding_efficiency(bucketed, lengths),
            "random": padding_efficiency(shuffled, lengths), "batches (bucketed)": len(bucketed),
            "batches (random)": len(shuffled)}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m msgcore.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["small", "base"], help="model presets (msgcore.model.PRESETS)")
    parser.add_argument("--device", type=device_option, default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--quick", action="store_true", help="1 warm-up and 2 timed steps: checks that it runs")
    parser.add_argument("--skip-hf", action="store_true", help="msgcore rows only (no transformers needed)")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile training row")
    parser.add_argument("--threads", type=whole(0, 1024), default=0, help="torch threads on CPU (0 = default)")
    parser.add_argument("--repeats", type=whole(1), default=BenchConfig.repeats,
                        help="runs of each measurement a target is judged on (training, beam 5 at batch 64)")
    parser.add_argument("--out", default="book/benchmarks",
                        help="folder for <device>.json and .md (the book's appendix reads it)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    if args.worker:
        job = json.loads(args.worker)
        cfg = BenchConfig(**job["cfg"])
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if resolve_device(cfg.device).type == "cpu" and job["spec"].get("allocator") != "default":
            keep_freed_memory()  # as msgcore's Trainer does on a CPU; every library's worker runs with it
        kind = job["spec"].get("of", job["spec"]["kind"])
        worker = {"train": train_worker, "peak": peak_worker}.get(kind, decode_worker)
        print(json.dumps(worker(job["spec"], cfg)))
        return 0
    cfg = BenchConfig(device=args.device, threads=args.threads, repeats=args.repeats)
    if args.quick:
        cfg = BenchConfig(device=args.device, threads=args.threads, warmup_steps=1, timed_steps=2, decode_length=5,
                          decode_batches=1, batch1_sentences=2, repeats=1)
    try:
        for name in args.presets:
            preset(name)  # an unknown preset is refused before any worker starts
        device = resolve_device(cfg.device)
        measured = []
        for spec in plan(args.presets, device, args.skip_hf, args.compile):
            measured.append((spec, run_worker(spec, cfg)))
            print(f"{spec}: " + ", ".join(f"{k} {v:.4g}" for k, v in measured[-1][1].items() if isinstance(v, float)),
                  flush=True)
        repeat_target_measurements(measured, cfg)
        rows = [row for _, row in measured]
        report = {"environment": environment(device, cfg), "rows": rows, "ratios": ratios(rows),
                  "padding": padding_report(cfg)}
        report["peak"] = {r["dtype"]: r["sustained GFLOP/s"] for r in rows if r["kind"] == "peak"}
        if device.type == "cuda":
            peak = H100_BF16_PEAK if any(n in device_name(device) for n in ("H100", "H200")) else None
            report["mfu"] = {r["preset"]: r["model TFLOP/s"] * 1e12 / peak for r in rows
                             if peak and r["kind"] == "train" and r["library"] == "msgcore" and "ablation" not in r}
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    slug = "".join(c if c.isalnum() else "-" for c in device_name(device)).strip("-").lower()
    out = Path(args.out)
    with atomic_write(out / f"{slug}.json") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with atomic_write(out / f"{slug}.md") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
