"""Coverage-NAT's recipes (Shan, Feng, Shao 2021): distillation, two-phase training, decoding, analyses.

    teacher   an autoregressive Transformer (chapter 0's recipe) that translates the training set
    KD        sequence-level knowledge distillation: the NAT models learn the teacher's outputs
    phase 1   L_mle + alpha * L_length until convergence                                  §III-D
    phase 2   + beta * L_coverage (SCA), fine-tuned at a small constant learning rate     §III-D
    decoding  argmax at the predicted length, or length parallel decoding (LPD) with l
              candidates rescored by the teacher; BLEU is always reported with and without
              the removal of consecutive repeats (the paper's claim is about repeats)
The chapter notebook calls these and tabulates; a GPU user can run the same functions as a script.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch

from msgcore.batching import EncodedCorpus, collate, example_lengths, token_batches
from msgcore.experiments import (RunResult, Scale, TranslationData, evaluate, limit_eval_splits, mean_std,  # noqa: F401
                                 train_model, train_translation)
from msgcore.generation import GenerationConfig, rescore
from msgcore.metrics import Score, corpus_score
from msgcore.model import PRESETS, Transformer, TransformerConfig
from msgcore.models.coverage_nat import (CoverageNAT, CoverageNATConfig, generate_lpd, generate_nat,
                                         remove_consecutive_repeats, repeat_ratio)
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import MsgcoreError


@dataclass
class NATScale:
    preset: str  # model preset of the teacher and the NAT models (msgcore.model.PRESETS)
    model: dict  # overrides of the preset and of CoverageNATConfig, e.g. dropout, max_length_offset
    teacher: TrainConfig  # the autoregressive teacher
    phase1: TrainConfig  # NAT phase 1: MLE + length loss
    phase2: TrainConfig  # NAT phase 2: + SCA at a small constant learning rate
    coverage_iterations: int = 5  # K_train of Coverage-NAT (the paper's main setting)
    beta: float = 0.5  # SCA loss weight in phase 2
    teacher_beam: int = 5  # beam of the teacher when it translates the training set (distillation)
    test_beam: int = 5  # beam of the AT row of Table II (BLEU and latency)
    lpd_candidates: int = 9  # l of length parallel decoding
    vocab_size: int = 8000  # joint sentencepiece vocabulary
    train_examples: int = 0  # first N training pairs (0 = all)
    eval_examples: int = 0  # first N dev/test sentences (0 = all)
    latency_sentences: int = 200  # sentences timed one by one for latency
    directions: tuple[tuple[str, str], ...] = (("de", "en"),)  # Multi30k (source, target); the first gets every analysis
    notes: str = ""  # what a reader should know about this scale


    def baseline(self) -> Scale:
        """The chapter-0 scale of the teacher (data sizes, vocabulary, beam)."""
        return Scale(self.preset, {k: v for k, v in self.model.items() if k in TransformerConfig.__dataclass_fields__},
                     self.teacher, vocab_size=self.vocab_size, train_examples=self.train_examples,
                     test_examples=self.eval_examples, beam_size=self.test_beam)


def _steps(steps: int, **kw) -> TrainConfig:
    """`steps` updates, validated three times (dev BLEU picks the checkpoint)."""
    base = dict(lr=1e-3, warmup_steps=max(steps // 10, 1), max_tokens=1536, max_epochs=1000, max_steps=steps,
                validate_every=max(steps // 3, 1), patience=0, valid_max_sentences=300,
                log_every=max(steps // 20, 1), progress=False)
    return TrainConfig(**{**base, **kw})


NAT_SCALES: dict[str, NATScale] = {
    "smoke": NATScale("tiny", dict(d_model=64, d_ff=128, n_heads=2, dropout=0.1, max_length_offset=32),
                      teacher=_steps(30), phase1=_steps(20), phase2=_steps(4, lr=1e-4, schedule="constant"),
                      teacher_beam=1, test_beam=2, lpd_candidates=3, vocab_size=1500, train_examples=2000, eval_examples=40,
                      latency_sentences=10, directions=(("de", "en"), ("en", "de")),
                      notes="CI only: checks that the chapter runs end to end; its numbers mean nothing."),
    "small": NATScale("tiny", dict(dropout=0.1, max_length_offset=32),
                      teacher=_steps(650, valid_max_sentences=300), phase1=_steps(250),
                      phase2=_steps(40, lr=1e-4, schedule="constant"),
                      teacher_beam=1, lpd_candidates=5, vocab_size=8000, latency_sentences=100,
                      directions=(("de", "en"), ("en", "de")),
                      notes="2 CPU cores, under 30 minutes: teachers of about 2 epochs, NAT models of 250 + 40 "
                            "updates (under one epoch), greedy distillation; the analyses on De→En only. "
                            "Nothing converges."),
    "full": NATScale("small", dict(dropout=0.1, max_length_offset=64),
                     teacher=_steps(30000, max_tokens=8192, lr=5e-4, warmup_steps=2000, validate_every=1000,
                                    valid_max_sentences=0, patience=8),
                     phase1=_steps(60000, max_tokens=8192, lr=5e-4, warmup_steps=4000, validate_every=2000,
                                   valid_max_sentences=0, patience=10),
                     phase2=_steps(4000, max_tokens=8192, lr=1e-5, schedule="constant", validate_every=500,
                                   valid_max_sentences=0),
                     teacher_beam=5, lpd_candidates=9, vocab_size=8000, latency_sentences=1000,
                     directions=(("de", "en"), ("en", "de")),
                     notes="One GPU: both directions' models trained to early stopping on dev BLEU; Table II for "
                           "both directions, the analyses on De→En."),
}


def nat_config(data: TranslationData, scale: NATScale, **fields) -> CoverageNATConfig:
    """The NAT model's config: the scale's preset and the paper's settings, overridden by `fields`."""
    if scale.preset not in PRESETS:
        raise MsgcoreError(f"unknown preset {scale.preset!r}; choose one of {sorted(PRESETS)}")
    tok = data.tokenizer
    return CoverageNATConfig(**{**PRESETS[scale.preset], "vocab_size": tok.vocab_size, "pad_id": tok.pad_id,
                                "unk_id": tok.unk_id, "eos_id": tok.eos_id,
                                "coverage_iterations": scale.coverage_iterations, **scale.model, **fields})


# ---- knowledge distillation ------------------------------------------------------------------

def distill(teacher, data: TranslationData, scale: NATScale, device: torch.device, split: str = "train") -> EncodedCorpus:
    """Sequence-level KD (Kim and Rush 2016): the split's sources with the teacher's beam outputs as targets."""
    encoded = data.encoded[split]
    hyps = translate_encoded(teacher, data.tokenizer, encoded, device, GenerationConfig(beam_size=scale.teacher_beam))
    targets = [ids if ids else [data.tokenizer.unk_id] for ids in data.tokenizer.encode_batch(hyps)]
    return EncodedCorpus(encoded.sources, targets, encoded.target_prefix, encoded.eos_id)


# ---- two-phase training ------------------------------------------------------------------------

def train_nat(data: TranslationData, scale: NATScale, device: torch.device, out_dir: Path, seed: int = 0,
              train: EncodedCorpus | None = None, beta: float | None = None,
              **fields) -> tuple[RunResult, RunResult | None]:
    """Phase 1, then phase 2 with SCA weight `beta` (default: the scale's); no phase 2 when beta = 0
    or for NAT-Base (`use_coverage=False`). `train` is e.g. the distilled corpus. Returns both runs."""
    torch.manual_seed(seed)
    model = CoverageNAT(nat_config(data, scale, **fields))
    phase1 = train_model(model, data, replace(scale.phase1, seed=seed), device, out_dir / "phase1", train=train)
    beta = scale.beta if beta is None else beta
    if beta == 0 or not model.cfg.use_coverage:
        return phase1, None
    return phase1, train_phase2(phase1.model, data, scale, device, out_dir / "phase2", seed, beta, train)


def train_phase2(phase1: CoverageNAT, data: TranslationData, scale: NATScale, device: torch.device, out_dir: Path,
                 seed: int = 0, beta: float | None = None, train: EncodedCorpus | None = None) -> RunResult:
    """Phase 2 (§III-D): a copy of the phase-1 model fine-tuned with the SCA loss weighted by `beta`."""
    model = CoverageNAT(replace(phase1.cfg, coverage_weight=scale.beta if beta is None else beta))  # Eq. (15)
    model.load_state_dict(phase1.state_dict())
    return train_model(model, data, replace(scale.phase2, seed=seed), device, out_dir, train=train)


# ---- one direction: the teacher, distillation and Table II's NAT models ----------------------------

@dataclass
class Direction:
    """One translation direction: its data, the autoregressive teacher and the distilled training set."""

    data: TranslationData
    teacher: Transformer  # the AT model: it distils, is Table II's AT row, and rescores LPD candidates
    teacher_hyps: list[str]  # its beam outputs on `split`
    teacher_scores: dict[str, Score]  # their BLEU and chrF (msgcore.experiments.evaluate)
    distilled: EncodedCorpus  # the training sources with the teacher's translations as targets
    distill_minutes: float  # wall time of the distillation
    split: str = "test_2016_flickr"  # the test split of Table II

    @property
    def name(self) -> str:
        """E.g. "De→En"."""
        train = self.data.corpora["train"]
        return f"{train.source_langs[0].title()}→{train.target_lang.title()}"

    @property
    def key(self) -> str:
        """E.g. "de-en", for folder names."""
        train = self.data.corpora["train"]
        return f"{train.source_langs[0]}-{train.target_lang}"


def train_direction(data: TranslationData, scale: NATScale, device: torch.device, out_dir: Path, seed: int = 0,
                    split: str = "test_2016_flickr") -> Direction:
    """Train the teacher (chapter 0's recipe with the scale's settings), test it on `split`, distil the training set."""
    baseline = scale.baseline()
    teacher = train_translation(data, baseline, device, Path(out_dir) / "teacher", seed=seed).model
    hyps, scores = evaluate(teacher, data, split, baseline, device)
    start = time.perf_counter()
    distilled = distill(teacher, data, scale, device)
    return Direction(data, teacher, hyps, scores, distilled, (time.perf_counter() - start) / 60, split)


def train_main_systems(direction: Direction, scale: NATScale, device: torch.device, out_dir: Path,
                       seeds: Sequence[int]) -> dict[tuple[str, int], RunResult]:
    """Table II's NAT models for each seed, on the distilled data: NAT-Base, and Coverage-NAT (K_train and
    beta from the scale) whose phase-1 model is "Coverage-NAT w/o SCA". Keyed (system, seed)."""
    data, train = direction.data, direction.distilled
    runs = {}
    for s in seeds:
        runs["NAT-Base", s] = train_nat(data, scale, device, out_dir / f"base-{s}", s, train=train, use_coverage=False)[0]
        phase1, phase2 = train_nat(data, scale, device, out_dir / f"cov-{s}", s, train=train)
        runs["Coverage-NAT w/o SCA", s], runs["Coverage-NAT", s] = phase1, phase2
    return runs


# ---- decoding ---------------------------------------------------------------------------------

@torch.no_grad()
def translate_nat(model: CoverageNAT, data: TranslationData, split: str, device: torch.device,
                  iterations: int | None = None, max_tokens: int = 6000) -> list[list[int]]:
    """Parallel argmax decoding of a split (K_dec = `iterations`), token ids with repeats kept, in order."""
    encoded, tok = data.encoded[split], data.tokenizer
    outputs: list[list[int]] = [[] for _ in range(len(encoded))]
    for idx in token_batches(example_lengths(encoded), max_tokens, shuffle=False):
        batch = collate(encoded, idx).to(device)
        for i, ids in zip(idx, generate_nat(model, batch.sources, batch.source_masks, iterations,
                                            forbidden=[tok.pad_id, tok.bos_id])):
            outputs[i] = ids
    return outputs


@torch.no_grad()
def translate_lpd(model: CoverageNAT, teacher, data: TranslationData, split: str, scale: NATScale,
                  device: torch.device, iterations: int | None = None, max_tokens: int = 2000) -> list[list[int]]:
    """Length parallel decoding: l candidates per sentence, the teacher keeps its favourite."""
    encoded, tok = data.encoded[split], data.tokenizer
    outputs: list[list[int]] = [[] for _ in range(len(encoded))]
    for idx in token_batches(example_lengths(encoded), max_tokens, shuffle=False):
        batch = collate(encoded, idx).to(device)
        candidates = generate_lpd(model, batch.sources, batch.source_masks, scale.lpd_candidates, iterations,
                                  forbidden=[tok.pad_id, tok.bos_id])
        chosen = rescore(teacher, batch.sources, batch.source_masks, encoded.target_prefix, tok.eos_id, candidates,
                         tok.pad_id)
        for i, ids in zip(idx, chosen):
            outputs[i] = ids
    return outputs


def bleu_with_and_without_dedup(outputs: list[list[int]], data: TranslationData, split: str) -> dict[str, float]:
    """BLEU of the raw outputs, BLEU after removing consecutive repeats, and the repeat ratio (%)."""
    refs, tok = data.corpora[split].target[:len(outputs)], data.tokenizer
    raw = [tok.decode(ids) for ids in outputs]
    dedup = [tok.decode(remove_consecutive_repeats(ids)) for ids in outputs]
    return {"BLEU": corpus_score("bleu", raw, refs).score, "BLEU (dedup)": corpus_score("bleu", dedup, refs).score,
            "repeats %": repeat_ratio(outputs)}


# ---- latency ------------------------------------------------------------------------------------

def latency(translate_one: Callable[[int], object], n: int, device: torch.device, warmup: int = 5) -> float:
    """Median seconds to translate one sentence (batch size 1) over sentences 0..n-1, after `warmup`
    untimed calls; on CUDA the device is synchronised before each clock read."""
    if n < 1:
        raise MsgcoreError("latency needs at least one sentence")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for i in range(min(warmup, n)):
        translate_one(i)
    times = []
    for i in range(n):
        sync()
        start = time.perf_counter()
        translate_one(i)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def single_batch(data: TranslationData, split: str, i: int, device: torch.device):
    """Sentence i of a split as a batch of one."""
    return collate(data.encoded[split], [i]).to(device)


def at_latency(teacher, data: TranslationData, split: str, beam: int, device: torch.device, n: int) -> float:
    """Median seconds per sentence of the autoregressive teacher's beam search, batch size 1."""
    cfg, prefix, eos = GenerationConfig(beam_size=beam), data.encoded[split].target_prefix, data.tokenizer.eos_id

    def translate_one(i):
        batch = single_batch(data, split, i, device)
        teacher.generate(batch.sources, batch.source_masks, prefix, eos, cfg)
    return latency(translate_one, n, device)


def nat_latency(model: CoverageNAT, data: TranslationData, split: str, device: torch.device, n: int,
                iterations: int | None = None) -> float:
    """Median seconds per sentence of parallel argmax decoding (K_dec = `iterations`), batch size 1."""
    def translate_one(i):
        batch = single_batch(data, split, i, device)
        generate_nat(model, batch.sources, batch.source_masks, iterations)
    return latency(translate_one, n, device)


def lpd_latency(model: CoverageNAT, teacher, data: TranslationData, split: str, scale: NATScale,
                device: torch.device, n: int) -> float:
    """Median seconds per sentence of LPD (l candidates) plus the teacher's rescoring, batch size 1."""
    prefix, eos = data.encoded[split].target_prefix, data.tokenizer.eos_id

    def translate_one(i):
        batch = single_batch(data, split, i, device)
        candidates = generate_lpd(model, batch.sources, batch.source_masks, scale.lpd_candidates)
        rescore(teacher, batch.sources, batch.source_masks, prefix, eos, candidates)
    return latency(translate_one, n, device)


# ---- Table II -------------------------------------------------------------------------------------

AT = "Transformer (AT)"


def lpd_name(scale: NATScale) -> str:
    return f"Coverage-NAT + LPD (l={scale.lpd_candidates}) + AT rescoring"


@dataclass
class Table2:
    """Table II for one direction: quality per run (seed) and latency of the first seed's models."""

    outputs: dict[tuple[str, int], list[list[int]]] = field(default_factory=dict)  # (system, seed) -> ids, repeats kept
    scores: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # system -> one score row per run
    latency: dict[str, float] = field(default_factory=dict)  # system -> median seconds per sentence

    def frame(self) -> pd.DataFrame:
        """BLEU, BLEU after dedup and repeats (mean ± std over runs), latency and speedup over the AT row."""
        at = self.latency[AT]
        return pd.DataFrame({name: {"runs": len(rows), **{m: mean_std(r[m] for r in rows)
                                                         for m in ("BLEU", "BLEU (dedup)", "repeats %")},
                                    "latency (ms)": f"{1000 * self.latency[name]:.1f}",
                                    "speedup": f"{at / self.latency[name]:.1f}×"}
                             for name, rows in self.scores.items()}).T


def table2(direction: Direction, runs: dict[tuple[str, int], RunResult], scale: NATScale, device: torch.device,
           seeds: Sequence[int], n_latency: int) -> Table2:
    """Translate the direction's test split with every system of Table II and time each at batch size 1.

    NAT-Base and Coverage-NAT are scored for every seed; the AT teacher and LPD (on the first seed's
    Coverage-NAT) once. Latency uses the first seed's models and the first `n_latency` sentences.
    """
    data, split, teacher, first = direction.data, direction.split, direction.teacher, seeds[0]
    table = Table2()
    table.outputs[AT, first] = data.tokenizer.encode_batch(direction.teacher_hyps)
    for name in ("NAT-Base", "Coverage-NAT"):
        for s in seeds:
            table.outputs[name, s] = translate_nat(runs[name, s].model, data, split, device)
    coverage_nat = runs["Coverage-NAT", first].model
    table.outputs[lpd_name(scale), first] = translate_lpd(coverage_nat, teacher, data, split, scale, device)
    for (name, _), ids in table.outputs.items():
        table.scores.setdefault(name, []).append(bleu_with_and_without_dedup(ids, data, split))
    n = min(n_latency, len(data.encoded[split]))
    table.latency = {AT: at_latency(teacher, data, split, scale.test_beam, device, n),
                     "NAT-Base": nat_latency(runs["NAT-Base", first].model, data, split, device, n),
                     "Coverage-NAT": nat_latency(coverage_nat, data, split, device, n),
                     lpd_name(scale): lpd_latency(coverage_nat, teacher, data, split, scale, device, n)}
    return table


# ---- analyses -------------------------------------------------------------------------------------

def source_lengths(data: TranslationData, split: str) -> list[int]:
    """Source length of each example, in pieces (without </s>)."""
    return [len(ids) - 1 for ids in data.encoded[split].sources[0]]


def repeats_by_half(outputs: Sequence[Sequence[int]], lengths: Sequence[int]) -> dict[str, float]:
    """Table IV: repeat ratio on the shorter half, the longer half and all sentences (split at the
    median source length; ties go to the short half)."""
    median = statistics.median(lengths)
    short = [o for o, n in zip(outputs, lengths) if n <= median]
    long = [o for o, n in zip(outputs, lengths) if n > median]
    return {"short": repeat_ratio(short), "long": repeat_ratio(long), "all": repeat_ratio(outputs)}


def bleu_by_length(hyps: Sequence[str], refs: Sequence[str], lengths: Sequence[int],
                   edges: Sequence[int]) -> dict[str, float]:
    """Figure 3: BLEU per source-length bucket [edges[i], edges[i+1]); the last bucket is open."""
    buckets = {}
    for lo, hi in zip(edges, [*edges[1:], None]):
        rows = [i for i, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
        name = f"{lo}-{hi - 1}" if hi is not None else f"{lo}+"
        if rows:
            buckets[name] = corpus_score("bleu", [hyps[i] for i in rows], [refs[i] for i in rows]).score
    return buckets
