"""TRICE's training stages and the systems of its Table 3, as recipes (Huang et al., ACL 2021, §2.2, §3).

    stage 0  denoising pre-training: a small stand-in for mBART-cc25 (msgcore.noising)
    stage 1  single-source finetuning: each example keeps one source, drawn with probability 1/K
    stage 2  multi-source finetuning: the fine encoder is added (random init) and everything trains

Systems (Table 3 of the paper):
    DualTrans    a multi-source Transformer from scratch: each source encoded separately by one
                 shared encoder, separated cross-attention, no pre-training
                 # Deviation: the paper's DualTrans (Junczys-Dowmunt and Grundkiewicz 2018) has one
                 # encoder per source and stacked cross-attentions.
    MBART-TRANS  the pre-trained model finetuned on one source
    DualBART     the pre-trained model finetuned directly on the concatenated sources (one joint
                 cross-attention, no segment embedding, no fine encoder)
    TRICE        stage 1, then stage 2 with the full model
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from msgcore.batching import encode_corpus
from msgcore.experiments import RunResult, TranslationData, train_model
from msgcore.model import Transformer, TransformerConfig, preset
from msgcore.models.trice import TriceConfig, TriceTransformer, from_single_source, sample_single_source
from msgcore.noising import denoising_corpus
from msgcore.trainer import Trainer, TrainConfig


@dataclass
class TriceScale:
    preset: str  # model preset for every system (msgcore.model.PRESETS)
    model: dict  # preset overrides, e.g. dropout
    pretrain: TrainConfig  # stage 0: denoising
    finetune: TrainConfig  # stages 1 and 2 and the baselines
    pretrain_sentences: int = 0  # monolingual sentences per language for stage 0 (0 = all training sides)


def base_config(data: TranslationData, scale: TriceScale) -> TransformerConfig:
    return preset(scale.preset, vocab_size=data.tokenizer.vocab_size, pad_id=data.tokenizer.pad_id, **scale.model)


def model_config(data: TranslationData, scale: TriceScale, **trice_fields) -> TriceConfig:
    return TriceConfig(**{**base_config(data, scale).to_dict(), **trice_fields})


def copy_model(model: Transformer) -> Transformer:
    """A fresh single-source model with the same weights (the pre-trained model stays untouched)."""
    clone = Transformer(model.cfg)
    clone.load_state_dict(model.state_dict())
    return clone


def pretrain(data: TranslationData, scale: TriceScale, device: torch.device, out_dir: Path,
             seed: int = 0) -> Transformer:
    """Stage 0: mBART-style denoising on every language side of the training data."""
    train = data.corpora["train"]
    n = scale.pretrain_sentences or len(train)
    texts = {lang: column[:n] for lang, column in zip(train.source_langs, train.sources)}
    texts[train.target_lang] = train.target[:n]
    torch.manual_seed(seed)
    model = Transformer(base_config(data, scale))
    trainer = Trainer(model, data.tokenizer, denoising_corpus(texts, data.tokenizer, seed=seed), None, None,
                      replace(scale.pretrain, seed=seed), device, out_dir)
    trainer.train()
    return trainer.model


def single_source_data(data: TranslationData, split: str, seed: int):
    """Stage-1 data: one source per example, drawn with probability 1/K (segment embedding off)."""
    return encode_corpus(sample_single_source(data.corpora[split], seed=seed), data.tokenizer,
                         max_len=128 if split == "train" else None)


def train_trice(pretrained: Transformer, data: TranslationData, scale: TriceScale, device: torch.device,
                out_dir: Path, seed: int = 0, **trice_fields) -> tuple[RunResult, RunResult]:
    """Stage 1 then stage 2; returns both runs (stage 2's model is TRICE)."""
    cfg = replace(scale.finetune, seed=seed)
    stage1 = train_model(copy_model(pretrained), data, cfg, device, out_dir / "stage1",
                         train=single_source_data(data, "train", seed), valid=single_source_data(data, "val", seed))
    torch.manual_seed(seed)
    model = from_single_source(stage1.model, model_config(data, scale, **trice_fields))
    return stage1, train_model(model, data, cfg, device, out_dir / "stage2")


def train_dualbart(pretrained: Transformer, data: TranslationData, scale: TriceScale, device: torch.device,
                   out_dir: Path, seed: int = 0) -> RunResult:
    """The pre-trained model finetuned directly on the concatenated sources."""
    cfg = model_config(data, scale, fine_layers=0, separated_cross_attention=False, segment_embedding=False)
    return train_model(from_single_source(pretrained, cfg), data, replace(scale.finetune, seed=seed), device, out_dir)


def train_dualtrans(data: TranslationData, scale: TriceScale, device: torch.device, out_dir: Path,
                    seed: int = 0) -> RunResult:
    """A multi-source Transformer trained from scratch (no pre-training)."""
    torch.manual_seed(seed)
    model = TriceTransformer(model_config(data, scale, fine_layers=0, concatenated_encoding=False))
    return train_model(model, data, replace(scale.finetune, seed=seed), device, out_dir)


def train_mbart_trans(pretrained: Transformer, single_source: TranslationData, scale: TriceScale,
                      device: torch.device, out_dir: Path, seed: int = 0) -> RunResult:
    """The pre-trained model finetuned on one source (`single_source` holds that direction)."""
    return train_model(copy_model(pretrained), single_source, replace(scale.finetune, seed=seed), device, out_dir)
