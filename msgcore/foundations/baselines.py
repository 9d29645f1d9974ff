"""Chapter 0's foundation runs: the Transformer baselines on Multi30k, De→En and En→De (Vaswani et al., 2017).

Their scales, data, training and claims. Chapter 2 compares its MixRep model with the De→En run (the same run
cache key, so it is trained once) and chapter 5 distils both directions; the command line trains a preset with
the scale that trains it for real (`cli_recipe`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from msgcore import floors
from msgcore.recipes import CPU_BOOK_SETTING, RunResult, Scale, TranslationData, get_scale, prepare_translation, train_translation
from msgcore.trainer import TrainConfig
from msgcore.verdicts import Claim, System, floor_system

BASELINE_SCALES: dict[str, Scale] = {
    "smoke": Scale("tiny", dict(dropout=0.1), TrainConfig(lr=1e-3, warmup_steps=50, max_tokens=2048,
                   max_epochs=1, max_steps=60, valid_max_sentences=100, patience=0, log_every=10),
                   vocab_size=2000, train_examples=3000, test_examples=100, beam_size=2,
                   notes="CI only: checks that the chapter runs end to end; its numbers mean nothing."),
    # Measured: with bf16 autocast (AMX/AVX-512 bf16 CPUs) the d=256 `small` preset trains faster than the fp32 d=128
    # `tiny` one did (4.1k vs 2.8k target tokens/s on 2 threads, book/benchmarks), so the CPU budget buys a 4x
    # larger model and more epochs. Under bf16 on a CPU, torch's math SDPA kernel computes the same attention 1.28-1.37x
    # faster per training step than its fused kernel on Multi30k's short sentences (the bench's ablation row; in
    # 10 minutes: 4.9k vs 3.7k target tokens/s and 38.7 vs 36.6 test BLEU, book/benchmarks/peers).
    "small": Scale("small", dict(dropout=0.1), TrainConfig(lr=1e-3, warmup_steps=400, max_tokens=2048,
                   max_epochs=6, valid_max_sentences=300, patience=0, log_every=50, **CPU_BOOK_SETTING),
                   vocab_size=8000, beam_size=5,
                   notes="2 CPU cores: the `small` preset (d=256, 3+3 layers) with bf16 autocast and torch's math "
                         "attention kernel, 6 epochs per direction."),
    "full": Scale("small", dict(dropout=0.3), TrainConfig(lr=5e-4, warmup_steps=2000, max_tokens=8192,
                  max_epochs=40, valid_max_sentences=0, patience=8, log_every=100),
                  vocab_size=8000, beam_size=5,
                  notes="One GPU; early stopping on dev BLEU."),
}


# The command line's recipe for each model preset: the chapter-0 scale that trains that preset for real.
CLI_RECIPE_SCALES = {"tiny": "small", "small": "full", "base": "full"}


def cli_recipe(preset_name: str) -> dict:
    """`python -m msgcore train`'s defaults for a preset, read from chapter 0's BASELINE_SCALES."""
    scale = BASELINE_SCALES[CLI_RECIPE_SCALES.get(preset_name, "full")]
    return {"lr": scale.train.lr, "warmup": scale.train.warmup_steps, "max_tokens": scale.train.max_tokens,
            "max_epochs": scale.train.max_epochs, "patience": scale.train.patience,
            "dropout": scale.model.get("dropout", 0.1), "vocab_size": scale.vocab_size}


BASELINE_DIRECTIONS = (("de", "en"), ("en", "de"))  # chapter 0 trains both; the De→En tokenizer serves both


def baseline_data(scale: Scale, seed: int = 0, allow_synthetic: bool = False) -> dict[str, TranslationData]:
    """Chapter 0's data: De→En and En→De on one joint tokenizer (trained on the De→En training side)."""
    de_en = prepare_translation("de", "en", scale, seed=seed, allow_synthetic=allow_synthetic)
    en_de = prepare_translation("en", "de", scale, seed=seed, tokenizer=de_en.tokenizer, allow_synthetic=allow_synthetic)
    return {"De→En": de_en, "En→De": en_de}


def train_baselines(scale_name: str, device: torch.device, out_dir: str | Path, seed: int = 0,
                    data: dict[str, TranslationData] | None = None) -> dict[str, RunResult]:
    """Every training run of chapter 0 (one per direction), through the run cache: chapter 5's teachers."""
    scale = get_scale(BASELINE_SCALES, scale_name)
    data = data or baseline_data(scale, seed, allow_synthetic=scale_name == "smoke")
    return {name: train_translation(d, scale, device, Path(out_dir) / name.replace("→", "-"), seed=seed)
            for name, d in data.items()}


# The published small-scale anchors on Multi30k test 2016 (chapter 0): neither is a paper's headline result, and
# neither scores with sacreBLEU's default; lowercased 13a BLEU is the nearest sacreBLEU variant to both.
BASELINE_ANCHORS = {
    "De→En": (36.52, "36.52: a 3-layer d=256 Transformer (bentrevett/pytorch-seq2seq), torchtext BLEU on spaCy "
                     "tokens"),
    "En→De": (41.02, "41.02: Transformer-tiny (LividWo/Revisit-MMT), fairseq BLEU, lowercased, tokenized BPE"),
}
BASELINE_FLOORS = ("copy input", "best constant")
ANCHOR_METRIC = "BLEU (lowercased)"  # sacreBLEU, lowercase=True, 13a tokenization


def baseline_claims() -> list[Claim]:
    """Chapter 0's claims, declared before its runs: each direction reaches its published anchor (in lowercased
    13a BLEU, the closest sacreBLEU variant) and clears the copy and constant floors."""
    return [Claim(id=f"anchor-{name}", claim=f"A small Transformer trained on Multi30k {name} reaches the published "
                  f"small-scale anchor", paper=text, kind="threshold", system=f"Transformer {name}",
                  metric=ANCHOR_METRIC, test_set="test_2016_flickr", threshold=value,
                  floors=tuple(f"{floor} {name}" for floor in BASELINE_FLOORS))
            for name, (value, text) in BASELINE_ANCHORS.items()]


def baseline_floor_systems(data: TranslationData, name: str, scale: Scale, split: str = "test_2016_flickr",
                           metric: str = ANCHOR_METRIC) -> list[System]:
    """Copying the source and the best constant output (chosen on the dev references) for one direction, on the
    test sentences `evaluate` scores (the scale's first `test_examples`)."""
    corpus, dev = data.corpora[split], data.corpora["val"]
    limit = scale.test_examples or len(corpus)
    sources, references = corpus.sources[0][:limit], corpus.target[:limit]
    options = {"lowercase": True} if metric == ANCHOR_METRIC else {}
    copy = floors.copy_input(sources, references, "bleu", **options)
    _, constant = floors.best_constant(dev.target, references, "bleu", **options)
    return [floor_system(f"copy input {name}", split, metric, copy),
            floor_system(f"best constant {name}", split, metric, constant)]
