"""Quality at a fixed budget: msgcore against the toolkits a reader would use instead.
`python -m msgcore.bench_peers --help`.

Each toolkit trains Multi30k De->En on the same sentences (msgcore.data.load_multi30k) for the same budget of
training time (`--minutes`, 10 by default) on the same number of CPU threads (`--threads`, 2), each in a fresh
process, at its own recommended settings for a small Transformer:
    msgcore  chapter 0's `small` recipe (BASELINE_SCALES["small"]): the `small` preset (d=256, 3+3 layers,
             pre-norm), bf16 autocast with torch's math SDPA kernel, AdamW lr 1e-3 with 400 warmup updates and
             inverse-sqrt decay, 2,048-token length-bucketed batches, label smoothing 0.1, joint sentencepiece
             unigram vocabulary of 8,000
    msgcore-fused  the same recipe with TrainConfig.sdpa_backends=(): torch picks the attention kernel (its fused
             CPU kernel, slower per step on short sequences under bf16 on CPU); the ablation of the recipe's kernel
    joeynmt  JoeyNMT 2.3's Transformer recipe for IWSLT14 De->En (its configs/iwslt14_deen_bpe.yaml: d=256, 6+6
             layers, 4 heads, FFN 1024, dropout 0.3, AdamW lr 3e-4 on a plateau schedule, 4,096-token batches,
             label smoothing 0.1), cased, with the same sentencepiece model as msgcore instead of subword-nmt BPE
    joeynmt-small  JoeyNMT at msgcore-small's dimensions and recipe (same token budget, warmup, peak lr, betas,
             clipping; JOEYNMT_SMALL_CONFIG), in fp32: the equal-size row
    hf       transformers' BartForConditionalGeneration trained by Seq2SeqTrainer: BART with BartConfig's
             defaults at msgcore-small's size (d=256, 3+3 layers), BART's own kind of tokenizer (byte-level BPE,
             8,000, trained on the training set), and msgcore's optimisation recipe expressed in
             Seq2SeqTrainingArguments (transformers publishes no from-scratch translation recipe)
    `JOEYNMT_CONFIG`, `JOEYNMT_SMALL_CONFIG` and `HF_SETTINGS` below are the exact settings; the report repeats them.
The decoding anchor (`decoding_worker`, skipped with --no-decoding) decodes chapter 0's model with msgcore and with
CTranslate2 (msgcore.export_ctranslate2).

The training clock counts training only: the data preparation before it and every evaluation during it (the
curve's and the toolkit's own validations) are left out. At `--points` moments spread evenly over the budget
each toolkit translates test_2016_flickr greedily with its own decoder, which gives the BLEU-vs-minutes curve;
when the budget is spent it translates the test set with beam 5. BLEU is sacreBLEU, cased and detokenized, with
the same scorer for every toolkit (msgcore.metrics.corpus_score).

The peers are benchmark-only dependencies in a venv of their own (`bash book/benchmarks/peers/setup.sh`, which
the book's install never runs). The report goes to book/benchmarks/peers/<device>.json and .md; the
performance appendix renders it.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

TOOLKITS = ("msgcore", "msgcore-fused", "joeynmt", "joeynmt-small", "hf")
NAMES = {"msgcore": "msgcore", "msgcore-fused": "msgcore, torch's choice of SDPA kernel", "joeynmt": "JoeyNMT",
         "joeynmt-small": "JoeyNMT at msgcore-small's size and recipe", "hf": "Hugging Face transformers"}
OURS = ("msgcore", "msgcore-fused")  # msgcore's rows; every other toolkit is a peer
SETUP = "bash book/benchmarks/peers/setup.sh"
DEFAULT_VENV = Path.home() / ".cache" / "msgcore" / "peers-venv"
TEST_SPLIT = "test_2016_flickr"
GOAL_TIME_FRACTION = 0.7  # the target: msgcore reaches the best peer's BLEU in <= 0.7x of that peer's time
PROGRESS = "[peers]"  # the workers' own progress lines start with this; the rest of their output goes to a log

# JoeyNMT 2.3, configs/iwslt14_deen_bpe.yaml: its Transformer recipe for IWSLT14 De->En, with these changes:
# data paths and sentencepiece (the same model as msgcore) instead of subword-nmt BPE, cased data and BLEU
# (lowercase False), use_cuda False (JoeyNMT turns fp16 off on a CPU anyway), keep_best_ckpts 1 and no printed
# validation sentences (disk and log only), and JoeyNMT's default output limit (1.5 x the longest source of the
# batch) instead of the config's 100 tokens for IWSLT's long sentences: JoeyNMT's search re-runs the decoder over
# the whole prefix at every step, so a half-trained model that does not stop yet would take minutes per curve
# point; on Multi30k's short sentences the limit is close to msgcore's (1.2 x source + 10).
JOEYNMT_CONFIG = {
    "name": "transformer_iwslt14_deen_bpe", "joeynmt_version": "2.3.0", "use_cuda": False, "random_seed": 42,
    "testing": {"n_best": 1, "beam_size": 5, "beam_alpha": 1.0, "batch_size": 1024, "batch_type": "token",
                "eval_metrics": ["bleu"], "return_prob": "none",
                "return_attention": False, "sacrebleu_cfg": {"tokenize": "13a", "lowercase": False}},
    "training": {"optimizer": "adamw", "normalization": "tokens", "adam_betas": [0.9, 0.999],
                 "scheduling": "plateau", "patience": 5, "decrease_factor": 0.7, "loss": "crossentropy",
                 "learning_rate": 0.0003, "learning_rate_min": 1e-08, "weight_decay": 0.0, "label_smoothing": 0.1,
                 "batch_size": 4096, "batch_type": "token", "early_stopping_metric": "bleu", "epochs": 100,
                 "validation_freq": 1000, "logging_freq": 100, "overwrite": True, "shuffle": True,
                 "print_valid_sents": [], "keep_best_ckpts": 1},
    "model": {"initializer": "xavier_uniform", "embed_initializer": "xavier_uniform", "embed_init_gain": 1.0,
              "init_gain": 1.0, "bias_initializer": "zeros", "tied_embeddings": True, "tied_softmax": True,
              **{part: {"type": "transformer", "num_layers": 6, "num_heads": 4,
                        "embeddings": {"embedding_dim": 256, "scale": True, "dropout": 0.0},
                        "hidden_size": 256, "ff_size": 1024, "dropout": 0.3, "layer_norm": "pre",
                        "activation": "relu"} for part in ("encoder", "decoder")}},
}
# JoeyNMT at msgcore-small's size and recipe: the same dimensions (d=256, 3+3 layers, 4 heads, FFN 1024, pre-norm,
# dropout 0.1), the same token budget (2,048), the same AdamW betas (0.9, 0.98), warmup (400 updates) to the same
# peak lr (1e-3) then inverse square-root decay, label smoothing 0.1 and gradient clipping at norm 1.0. What stays
# JoeyNMT's own: its model code, data pipeline, batching and search, and fp32 (JoeyNMT has no bf16 on a CPU).
JOEYNMT_SMALL_CONFIG = {
    **JOEYNMT_CONFIG, "name": "transformer_msgcore_small",
    "training": {**JOEYNMT_CONFIG["training"], "adam_betas": [0.9, 0.98], "scheduling": "warmupinversesquareroot",
                 "learning_rate": 1e-3, "learning_rate_peak": 1e-3, "learning_rate_warmup": 400,
                 "learning_rate_min": 1e-8, "batch_size": 2048, "clip_grad_norm": 1.0},
    "model": {**JOEYNMT_CONFIG["model"],
              **{part: {**JOEYNMT_CONFIG["model"][part], "num_layers": 3, "dropout": 0.1}
                 for part in ("encoder", "decoder")}},
}
for _unused in ("patience", "decrease_factor"):  # the plateau schedule's settings
    JOEYNMT_SMALL_CONFIG["training"].pop(_unused)
JOEYNMT_SIDE = {"max_length": 62, "lowercase": False, "normalize": False, "level": "bpe", "voc_min_freq": 1,
                "tokenizer_type": "sentencepiece"}

# Hugging Face: BartConfig's defaults (GELU, post-norm, learned positions, dropout 0.1) at msgcore-small's size;
# Seq2SeqTrainingArguments' defaults (fused AdamW, clipping at 1.0) but for msgcore's recipe: peak lr, warmup,
# inverse-sqrt decay, Adam beta2, label smoothing, bf16 autocast, and about the sentences of a 2,048-token batch
# (119 on average for Multi30k De->En) in length-grouped batches.
HF_SETTINGS = {
    "model": {"d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 4,
              "decoder_attention_heads": 4, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024},
    "tokenizer": {"kind": "byte-level BPE (tokenizers.ByteLevelBPETokenizer), joint", "vocab_size": 8000,
                  "min_frequency": 2},
    "training": {"learning_rate": 1e-3, "lr_scheduler_type": "inverse_sqrt", "warmup_steps": 400,
                 "adam_beta2": 0.98, "label_smoothing_factor": 0.1, "bf16": True,
                 "per_device_train_batch_size": 120, "train_sampling_strategy": "group_by_length"},
    "decoding": {"max_new_tokens": "1.2 x longest source + 10 per batch (msgcore's rule)", "batch_size": 64},
}


# ---- the training clock and the curve -------------------------------------------------------------------

class BudgetClock:
    """Training time against a budget, evaluation left out, and the BLEU-vs-minutes curve.

    A toolkit's training loop calls `begin()` when training starts and `after_update(tokens, sentences)` after
    every optimizer update; at each of the `points` moments spread evenly over the budget the clock pauses and
    calls `evaluate()` (test BLEU), and once the budget is spent `after_update` returns True and the clock stops.
    Anything else that is not training (a toolkit's own validation) goes inside `with clock.paused():`.
    """

    def __init__(self, budget_s: float, points: int, evaluate: Callable[[], float],
                 now: Callable[[], float] = time.perf_counter):
        self.budget_s, self.evaluate, self.now = budget_s, evaluate, now
        self.marks = [budget_s * k / points for k in range(1, points)] + [budget_s]
        self.start: float | None = None
        self.excluded = 0.0  # seconds of evaluation since start
        self.stopped_at: float | None = None  # training seconds when the budget ran out
        self.updates = self.tokens = self.sentences = 0
        self.curve: list[dict] = []

    def begin(self) -> None:
        if self.start is None:
            self.start = self.now()

    def training_s(self) -> float:
        if self.stopped_at is not None:
            return self.stopped_at
        return 0.0 if self.start is None else self.now() - self.start - self.excluded

    @property
    def expired(self) -> bool:
        return self.stopped_at is not None

    @contextlib.contextmanager
    def paused(self):
        start = self.now()
        try:
            yield
        finally:
            self.excluded += self.now() - start

    def after_update(self, tokens: int, sentences: int) -> bool:
        """Count one update; evaluate if a curve point has passed; True once the budget is spent."""
        self.updates, self.tokens, self.sentences = self.updates + 1, self.tokens + tokens, self.sentences + sentences
        elapsed = self.training_s()
        if self.marks and elapsed >= self.marks[0]:
            while self.marks and elapsed >= self.marks[0]:
                self.marks.pop(0)
            self.point(elapsed)
        if elapsed >= self.budget_s:
            self.stopped_at = elapsed
        return self.expired

    def point(self, elapsed: float) -> None:
        with self.paused():
            bleu = self.evaluate()
        self.curve.append({"minutes": elapsed / 60, "updates": self.updates, "target tokens": self.tokens,
                           "test BLEU": bleu})
        progress(f"{elapsed / 60:6.2f} min of training, {self.updates} updates: test BLEU {bleu:.2f} (greedy)")

    def finish(self) -> None:
        """Stop the clock (training ended before the budget did) and evaluate the last update if not yet done."""
        if self.stopped_at is None:
            self.stopped_at = self.training_s()
        if not self.curve or self.curve[-1]["updates"] != self.updates:
            self.point(self.stopped_at)

    def summary(self) -> dict:
        seconds = self.training_s()
        return {"train minutes": seconds / 60, "evaluation minutes (left out)": self.excluded / 60,
                "updates": self.updates, "target tokens": self.tokens, "training sentences": self.sentences,
                "target tokens/s": self.tokens / seconds if seconds else 0.0,
                "sentences/s": self.sentences / seconds if seconds else 0.0, "curve": self.curve}


def amount(n: float, unit: str) -> str:
    """"1 minute", "2.5 minutes"."""
    return f"{n:g} {unit}{'' if n == 1 else 's'}"


def progress(message: str) -> None:
    print(f"{PROGRESS} {message}", file=sys.stderr, flush=True)


# ---- the arithmetic of the comparison ---------------------------------------------------------------------

def time_to_reach(curve: list[dict], bleu: float) -> float | None:
    """Minutes of training at which `curve` first reaches `bleu`, linearly interpolated between its points
    (the curve starts at BLEU 0 at minute 0); None when it never does."""
    previous = {"minutes": 0.0, "test BLEU": 0.0}
    for point in curve:
        if point["test BLEU"] >= bleu:
            rise = point["test BLEU"] - previous["test BLEU"]
            if rise <= 0:
                return point["minutes"] if previous["test BLEU"] < bleu else previous["minutes"]
            share = (bleu - previous["test BLEU"]) / rise
            return previous["minutes"] + share * (point["minutes"] - previous["minutes"])
        previous = point
    return None


def final_bleu(result: dict) -> float:
    return result["final"]["test BLEU"]


def comparison(results: dict[str, dict], reference: str = "msgcore") -> dict | None:
    """msgcore against every peer that finished: final BLEU at the same budget, and the time msgcore needs to
    reach the best peer's BLEU as a fraction of that peer's own time, both read off the greedy curves.
    None when msgcore or every peer is missing."""
    done = {name: r for name, r in results.items() if "error" not in r and r.get("curve")}
    peers = {name: r for name, r in done.items() if name not in OURS}
    if reference not in done or not peers:
        return None
    ours = done[reference]
    rows = [{"peer": name, "msgcore BLEU": final_bleu(ours), "peer BLEU": final_bleu(r),
             "difference": final_bleu(ours) - final_bleu(r),
             "msgcore greedy BLEU": ours["curve"][-1]["test BLEU"], "peer greedy BLEU": r["curve"][-1]["test BLEU"]}
            for name, r in peers.items()]
    best = max(peers, key=lambda name: peers[name]["curve"][-1]["test BLEU"])
    target = peers[best]["curve"][-1]["test BLEU"]
    peer_minutes = time_to_reach(peers[best]["curve"], target)
    our_minutes = time_to_reach(ours["curve"], target)
    fraction = our_minutes / peer_minutes if our_minutes is not None and peer_minutes else None
    higher = all(row["difference"] > 0 for row in rows)
    return {"reference": reference, "final decoding": ours["final"]["decoding"], "peers": rows,
            "best peer": best, "best peer greedy BLEU": target, "best peer minutes": peer_minutes,
            "msgcore minutes to reach it": our_minutes, "time fraction": fraction,
            "msgcore higher than every peer": higher,
            "goal met": higher and fraction is not None and fraction <= GOAL_TIME_FRACTION}


# ---- the workers: one per toolkit, each in its own process -------------------------------------------------

def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def shared_data(job: dict, splits=("train", TEST_SPLIT)):
    """Multi30k De->En with chapter 0's joint tokenizer (its cache makes it the same model in every worker);
    the test set cut to `test_limit` sentences for quick checks."""
    from msgcore.experiments import BASELINE_SCALES, limit_eval_splits, prepare_translation

    data = prepare_translation("de", "en", BASELINE_SCALES["small"], seed=job.get("seed", 0), splits=splits)
    return limit_eval_splits(data, job.get("test_limit", 0))


def bleu(hypotheses: list[str], references: list[str]) -> float:
    from msgcore.metrics import corpus_score

    return corpus_score("bleu", hypotheses, references).score


def msgcore_run(data, scale, job: dict, out_dir: Path, now: Callable[[], float] = time.perf_counter) -> dict:
    """Train msgcore on `data` at `scale` until the budget is spent (by the clock `now`); the curve and the final
    test BLEU.

    TrainConfig has no time limit, so the budget lives here (BudgetTrainer), not in the shared trainer: the
    recipe runs unchanged, with its epoch cap lifted so that the budget alone stops it."""
    import torch

    from msgcore.generation import GenerationConfig
    from msgcore.model import Transformer, preset
    from msgcore.trainer import Trainer, translate_encoded

    class BudgetTrainer(Trainer):
        def train(self):
            self.clock.begin()
            return super().train()

        def train_step(self, batches, source_tokens=0, target_tokens=None):
            loss, tokens = super().train_step(batches, source_tokens, target_tokens)
            self.clock.after_update(tokens, sum(b.target_out.size(0) for b in batches))
            return loss, tokens

        def done(self) -> bool:
            return self.clock.expired or super().done()

    device = torch.device("cpu")
    test, refs = data.encoded[TEST_SPLIT], data.corpora[TEST_SPLIT].target

    def evaluate(beam: int = job["curve_beam"]) -> float:
        hyps = translate_encoded(model, data.tokenizer, test, device, GenerationConfig(beam_size=beam))
        return bleu(hyps, refs)

    torch.manual_seed(job.get("seed", 0))
    model = Transformer(preset(scale.preset, vocab_size=data.tokenizer.vocab_size, pad_id=data.tokenizer.pad_id,
                               **scale.model))
    train_cfg = replace(scale.train, max_epochs=10**6, max_steps=0, patience=0, progress=False,
                        seed=job.get("seed", 0))
    trainer = BudgetTrainer(model, data.tokenizer, data.encoded["train"], None, None, train_cfg, device, out_dir)
    trainer.clock = BudgetClock(job["minutes"] * 60, job["points"], evaluate, now=now)
    trainer.train()
    trainer.clock.finish()
    started = time.perf_counter()
    final = evaluate(job["final_beam"])
    return {**trainer.clock.summary(), "final": {"test BLEU": final, "decoding": f"beam {job['final_beam']}",
                                                 "minutes": (time.perf_counter() - started) / 60},
            "parameters (M)": sum(p.numel() for p in model.parameters()) / 1e6,
            "settings": {"recipe": "chapter 0's small recipe (msgcore.experiments.BASELINE_SCALES['small']), "
                                   "its epoch cap lifted: the budget stops it",
                         "model": {"preset": scale.preset, **model.cfg.to_dict()},
                         "training": {k: v for k, v in asdict(train_cfg).items() if k not in ("progress", "log_every")},
                         "tokenizer": f"sentencepiece unigram {data.tokenizer.vocab_size}, joint De+En",
                         "decoding": f"greedy for the curve, beam {job['final_beam']} at the end "
                                     "(msgcore.generation defaults: length penalty 1.0, at most 1.2 x source + 10)"}}


def msgcore_worker(job: dict) -> dict:
    """Chapter 0's `small` recipe; for "msgcore-fused" with torch's choice of SDPA kernel (TrainConfig.sdpa_backends)."""
    import torch

    import msgcore
    from msgcore.experiments import BASELINE_SCALES

    data = shared_data(job)
    scale = BASELINE_SCALES["small"]
    if job["toolkit"] == "msgcore-fused":
        scale = replace(scale, train=replace(scale.train, sdpa_backends=()))
    out_dir = Path(job["work"]) / job["toolkit"]
    return {"version": f"{msgcore.__version__}", "torch": torch.__version__,
            **msgcore_run(data, scale, job, out_dir)}


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def joeynmt_config(work: Path, spm_model: Path, vocab: Path, base: dict = JOEYNMT_CONFIG) -> dict:
    """`base` (JOEYNMT_CONFIG or JOEYNMT_SMALL_CONFIG) with this run's files: plain-text splits, the shared
    sentencepiece model and its vocabulary."""
    sides = {side: {"lang": lang, **JOEYNMT_SIDE, "voc_file": str(vocab),
                    "tokenizer_cfg": {"model_file": str(spm_model), "pretokenizer": "none"}}
             for side, lang in (("src", "de"), ("trg", "en"))}
    data = {"train": str(work / "train"), "dev": str(work / "dev"), "test": str(work / "test"),
            "dataset_type": "plain", **sides,
            "special_symbols": {"unk_token": "<unk>", "unk_id": 0, "pad_token": "<pad>", "pad_id": 1,
                                "bos_token": "<s>", "bos_id": 2, "eos_token": "</s>", "eos_id": 3}}
    return {**json.loads(json.dumps(base)), "model_dir": str(work / "model"), "data": data}


def joeynmt_compat() -> list[str]:
    """Let JoeyNMT 2.3.0 (January 2024, its last release) run on this torch and sentencepiece; neither shim
    changes what JoeyNMT computes. Returns what was shimmed, for the report."""
    import inspect

    import joeynmt.builders
    import sentencepiece as spm
    import torch

    shims = []
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
    if "verbose" not in inspect.signature(plateau.__init__).parameters:
        class Plateau(plateau):  # JoeyNMT passes verbose=False, an argument torch has since removed
            def __init__(self, *args, verbose=False, **kwargs):
                super().__init__(*args, **kwargs)

        joeynmt.builders.ReduceLROnPlateau = Plateau
        shims.append("ReduceLROnPlateau without `verbose`")
    if not hasattr(spm.SentencePieceProcessor, "SetVocabulary"):
        # JoeyNMT restricts sentencepiece to its vocabulary with SetVocabulary, which this sentencepiece no longer
        # has; the vocabulary here is every piece of the model, so the restriction would change nothing.
        spm.SentencePieceProcessor.SetVocabulary = lambda self, pieces: None
        shims.append("sentencepiece SetVocabulary as a no-op (the vocabulary is every piece)")
    return shims


def joeynmt_worker(job: dict) -> dict:
    """JoeyNMT's own data pipeline, model, TrainManager loop and search, with the budget hooked into its loop."""
    import logging

    import joeynmt
    import sentencepiece as spm
    import torch
    from joeynmt.config import parse_global_args, set_validation_args
    from joeynmt.prediction import predict, prepare
    from joeynmt.training import TrainManager

    logging.getLogger("joeynmt").setLevel(logging.WARNING)
    shims = joeynmt_compat()
    data = shared_data(job, splits=("train", "val", TEST_SPLIT))
    work = Path(job["work"]) / job["toolkit"]
    (work / "model").mkdir(parents=True, exist_ok=True)
    for name, split in (("train", "train"), ("dev", "val"), ("test", TEST_SPLIT)):
        corpus = data.corpora[split]
        write_lines(work / f"{name}.de", corpus.sources[0])
        write_lines(work / f"{name}.en", corpus.target)
    spm_model = work / "spm.model"
    data.tokenizer.save(spm_model)
    processor = spm.SentencePieceProcessor(model_file=str(spm_model))
    write_lines(work / "vocab.txt", [processor.id_to_piece(i) for i in range(processor.get_piece_size())
                                     if not (processor.is_control(i) or processor.is_unknown(i))])
    small = job["toolkit"] == "joeynmt-small"
    cfg = joeynmt_config(work, spm_model, work / "vocab.txt", JOEYNMT_SMALL_CONFIG if small else JOEYNMT_CONFIG)
    args = parse_global_args(json.loads(json.dumps(cfg)), rank=0, mode="train")
    model, train_data, dev_data, test_data = prepare(args, rank=0, mode="train")
    refs = data.corpora[TEST_SPLIT].target

    def evaluate(beam: int = job["curve_beam"]) -> float:
        test_args = args.test._replace(beam_size=beam) if beam > 1 else set_validation_args(args.test)
        _, _, hyps, *_ = predict(model=model, data=test_data, device=args.device, n_gpu=0, rank=0,
                                 compute_loss=False, args=test_args, autocast=args.autocast)
        return bleu(hyps, refs)

    own_validation = args.train.validation_freq

    class BudgetTrainManager(TrainManager):
        """JoeyNMT's loop, which calls `_validate` after every update here (validation_freq 1): the clock
        counts the update, and JoeyNMT's own validation still runs at its own frequency, off the clock."""

        def train_and_validate(self, train_data, valid_data):
            clock.begin()
            return super().train_and_validate(train_data, valid_data)

        def _train_step(self, batch):
            self.last_batch = (int(batch.ntokens), int(batch.nseqs))
            return super()._train_step(batch)

        def _validate(self, valid_data):
            if self.stats.steps % own_validation == 0:
                with clock.paused():
                    super()._validate(valid_data)
            if clock.after_update(*self.last_batch):
                self.stats.is_max_update = True  # JoeyNMT's own way out of its loop

    clock = BudgetClock(job["minutes"] * 60, job["points"], evaluate)
    trainer = BudgetTrainManager(model=model, model_dir=args.model_dir, device=args.device, n_gpu=0, rank=0,
                                 num_workers=args.num_workers, autocast=args.autocast, seed=args.seed,
                                 train_args=args.train._replace(validation_freq=1),
                                 dev_args=set_validation_args(args.test))
    trainer.train_and_validate(train_data=train_data, valid_data=dev_data)
    clock.finish()
    started = time.perf_counter()
    final = evaluate(job["final_beam"])
    shown = {k: v for k, v in cfg.items() if k not in ("data", "model_dir")}
    shown["data"] = {"src/trg": {**JOEYNMT_SIDE, "tokenizer": "the shared sentencepiece model"}}
    return {"version": joeynmt.__version__, "torch": torch.__version__, **clock.summary(),
            "final": {"test BLEU": final, "decoding": f"beam {job['final_beam']} (JoeyNMT search, beam_alpha 1.0)",
                      "minutes": (time.perf_counter() - started) / 60},
            "parameters (M)": sum(p.numel() for p in model.parameters()) / 1e6,
            "settings": {"recipe": ("msgcore-small's dimensions and recipe in JoeyNMT 2.3 (JOEYNMT_SMALL_CONFIG); "
                                    "CPU fp32" if small else
                                    "JoeyNMT 2.3 configs/iwslt14_deen_bpe.yaml (its Transformer for IWSLT14 De-En); "
                                    "sentencepiece instead of subword-nmt, cased, CPU fp32"), "config": shown,
                         "decoding": "greedy for the curve (its validation search), beam 5 at the end (its test "
                                     "settings: beam_alpha 1.0; output limit 1.5 x source, its default)",
                         "compatibility shims": shims}}


def hf_tokenizer(texts):
    """BART's kind of tokenizer trained on `texts`: byte-level BPE with <s> X </s> around every sequence."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4, as in BART
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=HF_SETTINGS["tokenizer"]["vocab_size"],
                            min_frequency=HF_SETTINGS["tokenizer"]["min_frequency"], special_tokens=specials,
                            show_progress=False)
    bpe._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>", mask_token="<mask>")


def hf_translate(model, tokenizer, sources: list[str], beam: int) -> list[str]:
    """`model.generate` over length-sorted batches; the output in the order of `sources`."""
    import torch
    from transformers import GenerationConfig

    batch_size = HF_SETTINGS["decoding"]["batch_size"]
    ids = tokenizer(sources, truncation=True, max_length=256)["input_ids"]
    order = sorted(range(len(sources)), key=lambda i: len(ids[i]))
    out = [""] * len(sources)
    model.eval()
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in chunk]}, return_tensors="pt")
        config = GenerationConfig(num_beams=beam, do_sample=False, length_penalty=1.0,
                                  max_new_tokens=int(1.2 * batch["input_ids"].size(1)) + 10,
                                  decoder_start_token_id=2, bos_token_id=0, eos_token_id=2, pad_token_id=1)
        with torch.no_grad():
            generated = model.generate(**batch, generation_config=config)
        for i, text in zip(chunk, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            out[i] = text.strip()
    return out


def hf_worker(job: dict) -> dict:
    """transformers' Seq2SeqTrainer, with the budget as a TrainerCallback that stops it."""
    import torch
    import transformers
    from transformers import (BartConfig, BartForConditionalGeneration, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                              Seq2SeqTrainingArguments, TrainerCallback)

    transformers.logging.set_verbosity_error()
    data = shared_data(job)
    train, test = data.corpora["train"], data.corpora[TEST_SPLIT]
    tokenizer = hf_tokenizer(train.texts())
    encoded = tokenizer(train.sources[0], text_target=train.target, truncation=True, max_length=128)
    dataset = [{"input_ids": a, "attention_mask": m, "labels": y}
               for a, m, y in zip(encoded["input_ids"], encoded["attention_mask"], encoded["labels"])]
    torch.manual_seed(job.get("seed", 0))
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=len(tokenizer), pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=2, **HF_SETTINGS["model"]))

    def evaluate(beam: int = job["curve_beam"]) -> float:
        return bleu(hf_translate(model, tokenizer, test.sources[0], beam), test.target)

    clock = BudgetClock(job["minutes"] * 60, job["points"], evaluate)
    counts = [0, 0]  # target tokens and sentences of the current update

    class CountingTrainer(Seq2SeqTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            counts[0] += int(inputs["labels"].ne(-100).sum())
            counts[1] += int(inputs["labels"].size(0))
            return super().training_step(model, inputs, num_items_in_batch)

    class Budget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.begin()

        def on_step_end(self, args, state, control, **kwargs):
            if clock.after_update(*counts):
                control.should_training_stop = True
            counts[:] = [0, 0]

    args = Seq2SeqTrainingArguments(
        output_dir=str(Path(job["work"]) / "hf"), num_train_epochs=1000, use_cpu=True, seed=job.get("seed", 0),
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        **HF_SETTINGS["training"])
    trainer = CountingTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                              data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), callbacks=[Budget()])
    trainer.train()
    clock.finish()
    started = time.perf_counter()
    final = evaluate(job["final_beam"])
    return {"version": transformers.__version__, "torch": torch.__version__, **clock.summary(),
            "final": {"test BLEU": final, "decoding": f"beam {job['final_beam']} (model.generate, length penalty 1.0)",
                      "minutes": (time.perf_counter() - started) / 60},
            "parameters (M)": model.num_parameters() / 1e6,
            "settings": {"recipe": "BartForConditionalGeneration (BartConfig defaults at msgcore-small's size) "
                                   "with Seq2SeqTrainer at msgcore's optimisation recipe", **HF_SETTINGS,
                         "optimizer": args.optim, "max_grad_norm": args.max_grad_norm}}


# ---- the decoding anchor: chapter 0's model in msgcore and in CTranslate2 ------------------------------------

DECODING_BATCH_SIZES = (1, 64)  # sentences a call: one at a time (latency), and a batch (throughput)


def decoding_worker(job: dict) -> dict:
    """Chapter 0's `small` De->En model (its run-cache entry; trained first if the cache lacks it) translating the
    test set with beam `final_beam`, in corpus order, by msgcore (float32) and by CTranslate2 (the same weights
    exported as float32 and as int8), at each of DECODING_BATCH_SIZES sentences a call, after a warm-up call."""
    import ctranslate2
    import torch

    from msgcore import export_ctranslate2 as ct2
    from msgcore.batching import EncodedCorpus
    from msgcore.foundations.baselines import BASELINE_SCALES, baseline_data
    from msgcore.generation import GenerationConfig
    from msgcore.recipes import train_translation

    scale, work = BASELINE_SCALES["small"], Path(job["work"])
    data = baseline_data(scale, job.get("seed", 0))["De→En"]
    run = train_translation(data, scale, torch.device("cpu"), work / "chapter0", seed=job.get("seed", 0))
    model, tokenizer = run.model.eval(), data.tokenizer
    refs = data.corpora[TEST_SPLIT].target[:job.get("test_limit") or None]
    test = data.encoded[TEST_SPLIT]
    test = EncodedCorpus([test.sources[0][:len(refs)]], test.target[:len(refs)], test.target_prefix, test.eos_id)
    cfg = GenerationConfig(beam_size=job["final_beam"])
    warm_up = EncodedCorpus([test.sources[0][:8]], test.target[:8], test.target_prefix, test.eos_id)
    engines = {("msgcore", "float32"): lambda corpus, size: msgcore_decode(model, tokenizer, corpus, cfg, size)}
    for quantization in ct2.QUANTIZATIONS:
        translator = ctranslate2.Translator(str(ct2.export(model, tokenizer, work / f"ct2-{quantization}", quantization)),
                                            device="cpu", inter_threads=1, intra_threads=job["threads"])
        engines["CTranslate2", quantization] = (
            lambda t: lambda corpus, size: ct2.translate(t, tokenizer, corpus, cfg, size))(translator)
    rows = []
    for size in DECODING_BATCH_SIZES:
        for (decoder, weights), decode in engines.items():
            progress(f"{decoder} {weights}, {size} sentence(s) a call")
            decode(warm_up, size)  # the first calls pay for allocations and caches
            started = time.perf_counter()
            hyps = decode(test, size)
            seconds = time.perf_counter() - started
            rows.append({"decoder": decoder, "weights": weights, "batch size": size, "test BLEU": bleu(hyps, refs),
                         "sentences/s": len(refs) / seconds, "ms per sentence": 1000 * seconds / len(refs)})
    return {"version": f"CTranslate2 {ctranslate2.__version__}", "rows": rows, "sentences": len(refs),
            "model": f"chapter 0's De->En run ({'reused from' if run.reused else 'trained into'} the run cache)",
            "decoding": f"beam {cfg.beam_size}, length penalty {cfg.len_penalty}, at most "
                        f"{cfg.max_len_a} x source + {cfg.max_len_b} tokens (CTranslate2: per call, its longest source)"}


def msgcore_decode(model, tokenizer, test, cfg, size: int) -> list[str]:
    """msgcore's beam search over `size` sentences a call, in corpus order (no length bucketing, as CTranslate2's)."""
    import torch

    from msgcore.batching import collate

    out = []
    with torch.no_grad():
        for start in range(0, len(test), size):
            batch = collate(test, range(start, min(start + size, len(test))))
            ids = model.generate(batch.sources, batch.source_masks, test.target_prefix, tokenizer.eos_id, cfg,
                                 [tokenizer.pad_id, tokenizer.bos_id])
            out += [tokenizer.decode(hyp) for hyp in ids]
    return out


def decoding_table(report: dict):
    """The decoding anchor as a table, with each row's speed as a multiple of msgcore's at the same batch size."""
    import pandas as pd

    rows = (report.get("decoding") or {}).get("rows", [])
    ours = {r["batch size"]: r["sentences/s"] for r in rows if r["decoder"] == "msgcore"}
    return pd.DataFrame([{**{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()},
                          "speed vs msgcore": f"{r['sentences/s'] / ours[r['batch size']]:.2f}x"} for r in rows])


WORKERS = {"msgcore": msgcore_worker, "msgcore-fused": msgcore_worker, "joeynmt": joeynmt_worker,
           "joeynmt-small": joeynmt_worker, "hf": hf_worker, "ctranslate2": decoding_worker}


def run_worker_here(job: dict) -> None:
    """The worker process: train one toolkit and write its result (as JSON) to job["result"]."""
    import torch

    torch.set_num_threads(job["threads"])
    started = time.perf_counter()
    result = WORKERS[job["toolkit"]](job)
    result.update({"peak RSS (MB)": peak_rss_mb(), "process minutes": (time.perf_counter() - started) / 60,
                   "threads": torch.get_num_threads()})
    Path(job["result"]).write_text(json.dumps(result))


# ---- the parent: one worker per toolkit, then the report ---------------------------------------------------

def peers_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def launch(job: dict, python: str, log: Path) -> dict:
    """Run one toolkit's worker; forward its progress lines, keep the rest of its output in `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"]), "MKL_NUM_THREADS": str(job["threads"]),
           "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    command = [python, "-m", "msgcore.bench_peers", "--worker", json.dumps(job)]
    started = time.perf_counter()
    tail: collections.deque[str] = collections.deque(maxlen=15)
    with open(log, "w") as saved, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                   text=True, env=env) as process:
        for line in process.stdout:
            saved.write(line)
            tail.append(line.rstrip())
            if line.startswith(PROGRESS):
                print(f"{job['toolkit']}: {line[len(PROGRESS):].strip()}", flush=True)
    wall = (time.perf_counter() - started) / 60
    if process.returncode != 0 or not Path(job["result"]).is_file():
        return {"error": next((t for t in reversed(tail) if t.strip()), f"exit status {process.returncode}"),
                "wall minutes": wall, "log tail": list(tail)}
    return {**json.loads(Path(job["result"]).read_text()), "wall minutes": wall}


def environment(threads: int) -> dict:
    import torch

    from msgcore.utils import device_name, git_commit

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    torch.set_num_threads(threads)
    return {"device": device_name(torch.device("cpu")), "cpu": model, "threads": threads,
            "torch": torch.__version__, "python": platform.python_version(), "git commit": git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def report_slug(env: dict) -> str:
    return "".join(c if c.isalnum() else "-" for c in env["device"]).strip("-").lower()


def tables(report: dict) -> dict:
    """The report as pandas tables: toolkits, recipes, curves and, when there is one, the comparison."""
    import pandas as pd

    rows, curves, recipes = [], [], []
    for name, r in report["toolkits"].items():
        if "error" in r:
            rows.append({"toolkit": NAMES[name], "error": r["error"]})
            continue
        rows.append({"toolkit": NAMES[name], "version": r["version"], "parameters (M)": round(r["parameters (M)"], 1),
                     "updates": r["updates"], "train minutes": round(r["train minutes"], 2),
                     "target tokens/s": round(r["target tokens/s"]), "sentences/s": round(r["sentences/s"], 1),
                     "peak RSS (MB)": round(r["peak RSS (MB)"]),
                     "test BLEU, greedy": round(r["curve"][-1]["test BLEU"], 2),
                     f"test BLEU, {r['final']['decoding'].split(' (')[0]}": round(final_bleu(r), 2),
                     "wall minutes": round(r["wall minutes"], 1), "run": r.get("run", "–")})
        curves += [{"toolkit": NAMES[name], "minutes": round(p["minutes"], 2), "updates": p["updates"],
                    "target tokens": p["target tokens"], "test BLEU": round(p["test BLEU"], 2)} for p in r["curve"]]
        recipes.append({"toolkit": NAMES[name], "recipe": r["settings"]["recipe"] + kernel_note(r["settings"])})
    out = {"toolkits": pd.DataFrame(rows), "recipes": pd.DataFrame(recipes), "curves": pd.DataFrame(curves)}
    if (report.get("decoding") or {}).get("rows"):
        out[f"decoding anchor: {report['decoding']['decoding']}"] = decoding_table(report)
    for ours, cmp in comparisons(report).items():
        key = "comparison" if ours == "msgcore" else f"comparison, {NAMES[ours]}"
        out[key] = pd.DataFrame([{"peer": NAMES[r["peer"]], "msgcore BLEU": round(r["msgcore BLEU"], 2),
                                  "peer BLEU": round(r["peer BLEU"], 2),
                                  "msgcore - peer": round(r["difference"], 2)} for r in cmp["peers"]])
    return out


def comparisons(report: dict) -> dict[str, dict]:
    """msgcore variant -> its comparison with the peers (a report from before the variants has one, "msgcore")."""
    found = report.get("comparisons") or {"msgcore": report.get("comparison")}
    return {name: cmp for name, cmp in found.items() if cmp}


def verdict(report: dict) -> list[str]:
    """The comparison in sentences (the appendix prints the same)."""
    found = comparisons(report)
    if not found:
        return ["No comparison: it needs msgcore and at least one peer that finished."]
    return [line for ours, cmp in found.items() for line in verdict_of(cmp, ours, report["config"]["minutes"])]


def verdict_of(cmp: dict, ours: str, minutes: float) -> list[str]:
    """One msgcore variant's comparison in sentences."""
    name = NAMES[ours]
    fraction = cmp["time fraction"]
    if fraction is not None:
        reach = (f"{name} reaches it after {cmp['msgcore minutes to reach it']:.2f} minutes of training, "
                 f"{fraction:.2f}x that peer's {cmp['best peer minutes']:.2f} minutes")
    elif cmp["msgcore minutes to reach it"] is not None:  # a peer that never left BLEU 0: no time to compare with
        reach = "every curve starts there, so there is no time to compare"
    else:
        reach = f"{name} does not reach it within the budget"
    above = "above" if cmp["msgcore higher than every peer"] else "not above"
    return [f"At {amount(minutes, 'minute')} of training, {name} is {above} every peer in test BLEU "
            f"({cmp['final decoding']}).",
            f"The best peer, {NAMES[cmp['best peer']]}, ends at {cmp['best peer greedy BLEU']:.2f} greedy BLEU; "
            f"{reach}.",
            f"Goal for {name} (higher than every peer, and <= {GOAL_TIME_FRACTION}x the best peer's time): "
            f"{'met' if cmp['goal met'] else 'not met'}."]


def markdown(report: dict) -> str:
    env, config = report["environment"], report["config"]
    lines = [f"Device: {env['device']} ({env['cpu']}); torch {env['torch']}, commit {env['git commit']}, "
             f"{env['date']}. Budget: {amount(config['minutes'], 'minute')} of training per toolkit on "
             f"{amount(config['threads'], 'thread')}; Multi30k De->En, {config['test split']} "
             f"({config['test sentences']} sentences).", ""]
    for name, table in tables(report).items():
        if len(table):
            lines += [f"### {name}", "", table.to_markdown(index=False), ""]
    decoding = report.get("decoding") or {}
    if "error" in decoding:
        lines += ["### decoding anchor", "", f"Failed: {decoding['error']}", ""]
    elif decoding:
        lines += [f"Decoding anchor: {decoding['model']}, {decoding['version']}, {decoding['sentences']} test "
                  "sentences; each speed after a warm-up call.", ""]
    lines += ["### verdict", "", *verdict(report), "", "### settings", ""]
    for name, r in report["toolkits"].items():
        if "settings" in r:
            lines += [f"{NAMES[name]}:", "", "```json", json.dumps(r["settings"], indent=1), "```", ""]
    return "\n".join(lines + [""])


def kernel_note(settings: dict) -> str:
    """"; SDPA kernels: math (...)" for a msgcore row, which names its attention kernels; "" for a peer's."""
    kernels = settings.get("training", {}).get("sdpa_backends")
    if kernels is None:
        return ""
    return f"; SDPA kernels: {', '.join(kernels) or 'torch chooses'} (TrainConfig.sdpa_backends)"


def earlier_results(path: Path, config: dict, training: list[str]) -> tuple[dict, str | None]:
    """(the toolkits of the report at `path` that this run does not train, None), or ({}, the reason they cannot
    be kept): they must have run at the same budget, threads, curve points, final beam and test set. A toolkit
    this bench no longer names (a variant since renamed or dropped) is not kept."""
    if not path.is_file():
        return {}, None
    try:
        old = json.loads(path.read_text())
        old_config, env = old["config"], old["environment"]
    except (ValueError, KeyError) as error:
        return {}, f"--merge: {path} is not a peers report ({type(error).__name__})"
    for key in ("minutes", "threads", "points", "final beam", "test split", "test sentences"):
        if old_config.get(key) != config[key]:
            return {}, f"--merge: {path} ran with {key} {old_config.get(key)!r}, this run with {config[key]!r}"
    return {name: {"run": f"commit {env['git commit']}, {env['date']}", **r}
            for name, r in old["toolkits"].items() if name not in training and name in TOOLKITS}, None


def write_report(report: dict, out: Path) -> Path:
    """Write <out>/<device>.json and .md atomically; returns the JSON's path."""
    from msgcore.utils import atomic_write

    path = Path(out) / f"{report_slug(report['environment'])}.json"
    with atomic_write(path) as f:
        json.dump(report, f, indent=1)
    with atomic_write(path.with_suffix(".md")) as f:
        f.write(markdown(report))
    return path


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m msgcore.bench_peers", description=__doc__.splitlines()[0])
    parser.add_argument("--toolkits", nargs="+", default=list(TOOLKITS), metavar="NAME",
                        help=f"toolkits to train, of {', '.join(TOOLKITS)} (default: all)")
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget per toolkit (default 10)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per toolkit (default 2)")
    parser.add_argument("--points", type=int, default=10,
                        help="curve points, evenly spread over the budget, the last at its end (default 10)")
    parser.add_argument("--final-beam", type=int, default=5, help="beam of the final test translation (default 5)")
    parser.add_argument("--test-limit", type=int, default=0,
                        help="translate only the first N test sentences (quick checks; default 0 = all 1,000)")
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("MSGCORE_PEERS_VENV", DEFAULT_VENV)),
                        help=f"the peers' venv, made by `{SETUP}` (default $MSGCORE_PEERS_VENV or {DEFAULT_VENV})")
    parser.add_argument("--out", type=Path, default=Path("book/benchmarks/peers"),
                        help="folder for <device>.json and .md (the book's appendix reads it)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the toolkits of the report already in --out that this run does not train "
                             "(same budget, threads and test set; each row names the commit and date it ran at)")
    parser.add_argument("--no-decoding", dest="decoding", action="store_false",
                        help="skip the decoding anchor (chapter 0's model in msgcore and in CTranslate2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def check(args) -> str | None:
    """The first thing wrong with the options, as one line, or None."""
    unknown = [t for t in args.toolkits if t not in TOOLKITS]
    if unknown:
        return f"unknown toolkit {unknown[0]!r}; choose from {', '.join(TOOLKITS)}"
    if len(set(args.toolkits)) != len(args.toolkits):
        return "a toolkit is named twice in --toolkits"
    for name in ("minutes", "threads", "points", "final_beam"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):  # an infinite budget would never end
            return f"--{name.replace('_', '-')} must be positive and finite, not {value}"
    if args.test_limit < 0:
        return f"--test-limit must be 0 (all) or positive, not {args.test_limit}"
    if (args.decoding or any(t not in OURS for t in args.toolkits)) and not peers_python(args.venv).is_file():
        return f"the peers' venv {args.venv} is missing: run `{SETUP}` first (or pass --venv)"
    if args.out.exists() and not args.out.is_dir():
        return f"--out {args.out} is a file, not a folder"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker_here(json.loads(args.worker))
        return 0
    problem = check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    env = environment(args.threads)
    config = {"minutes": args.minutes, "threads": args.threads, "points": args.points, "curve decoding": "greedy",
              "final beam": args.final_beam, "test split": TEST_SPLIT,
              "test sentences": min(args.test_limit, 1000) if args.test_limit else 1000,
              "toolkits": args.toolkits}
    earlier = {}
    if args.merge:
        earlier, problem = earlier_results(args.out / f"{report_slug(env)}.json", config, args.toolkits)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    work = Path(tempfile.mkdtemp(prefix="msgcore-peers-"))
    results = {}
    try:
        for toolkit in args.toolkits:
            print(f"{toolkit}: training for {amount(args.minutes, 'minute')} on {amount(args.threads, 'thread')}",
                  flush=True)
            job = {"toolkit": toolkit, "minutes": args.minutes, "threads": args.threads, "points": args.points,
                   "curve_beam": 1, "final_beam": args.final_beam, "test_limit": args.test_limit, "seed": 0,
                   "work": str(work), "result": str(work / f"{toolkit}.json")}
            python = sys.executable if toolkit in OURS else str(peers_python(args.venv))
            results[toolkit] = {**launch(job, python, work / f"{toolkit}.log"),
                                "run": f"commit {env['git commit']}, {env['date']}"}
            r = results[toolkit]
            summary = (f"failed: {r['error']}" if "error" in r else
                       f"test BLEU {final_bleu(r):.2f} ({r['final']['decoding']}), {r['updates']} updates, "
                       f"{r['target tokens/s']:.0f} target tokens/s, peak RSS {r['peak RSS (MB)']:.0f} MB, "
                       f"{r['wall minutes']:.1f} min wall")
            print(f"{toolkit}: {summary}", flush=True)
        if args.decoding:
            print(f"decoding anchor: chapter 0's model in msgcore and CTranslate2, beam {args.final_beam}", flush=True)
            job = {"toolkit": "ctranslate2", "threads": args.threads, "final_beam": args.final_beam,
                   "test_limit": args.test_limit, "seed": 0, "work": str(work), "result": str(work / "decoding.json")}
            decoding = {**launch(job, str(peers_python(args.venv)), work / "decoding.log"),
                        "run": f"commit {env['git commit']}, {env['date']}"}
            print(f"decoding anchor: {decoding.get('error', 'done')}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {**earlier, **results}
    config["toolkits"] = list(results)
    found = {ours: comparison(results, ours) for ours in OURS if ours in results}
    report = {"environment": env, "config": config, "toolkits": results, "comparison": found.get("msgcore"),
              "comparisons": found, "decoding": decoding if args.decoding else None}
    print(write_report(report, args.out).with_suffix(".md").read_text())
    return 1 if any("error" in r for r in [*results.values(), *([decoding] if args.decoding else [])]) else 0


if __name__ == "__main__":
    sys.exit(main())
