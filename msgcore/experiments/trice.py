"""TRICE's training stages, systems and tables, as recipes (Huang et al., ACL 2021, §2.2, §3).

    stage 0  denoising pre-training: a small stand-in for mBART-cc25 (msgcore.noising)
    stage 1  single-source finetuning: each example keeps one source, drawn with probability 1/K
    stage 2  multi-source finetuning: the fine encoder is added (random init) and everything trains

Systems (Tables 2-4 of the paper):
    DualTrans       a multi-source Transformer from scratch: each source encoded separately by one
                    shared encoder, separated cross-attention, no pre-training
                    # Deviation: the paper's DualTrans (Junczys-Dowmunt and Grundkiewicz 2018) has one
                    # encoder per source and stacked cross-attentions.
    MBART-TRANS     the pre-trained model finetuned on one source
    MBART-DOCTRANS  the pre-trained model finetuned on "previous <sep> current" -> "previous <sep> current"
    DualBART        the pre-trained model finetuned directly on the concatenated sources (one joint
                    cross-attention, no segment embedding, no fine encoder)
    TRICE           stage 1, then stage 2 with the full model

One tokenizer and one pre-trained model serve the three tasks, as mBART-cc25 does in the paper:
Multi30k De+Fr->En (multi-source translation), WMT16/17 APE (src+mt->pe) and TED (previous
sentence + current sentence -> English). A scale (`TRICE_SCALES`) fixes every size and step count.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from msgcore.batching import EncodedCorpus
from msgcore.data import Corpus, load_ape, load_doc_level, load_multi30k, synthetic_corpus
from msgcore.experiments import RunResult, TranslationData, get_scale, train_model
from msgcore.generation import GenerationConfig
from msgcore.metrics import corpus_score
from msgcore.model import Transformer, TransformerConfig, preset
from msgcore.models.trice import TriceConfig, TriceTransformer, from_single_source
from msgcore.noising import copy_corpus, denoising_corpus, tagged_source, tagged_target
from msgcore.tokenizer import SEP_PIECE, Tokenizer
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import DataError, MsgcoreError


@dataclass
class TriceScale:
    preset: str  # model preset for every system (msgcore.model.PRESETS)
    model: dict  # preset overrides, e.g. dropout
    pretrain: TrainConfig  # stage 0: denoising; validates on clean held-out sentences (copy BLEU)
    finetune: TrainConfig  # one finetuning run (a baseline, MBART-TRANS, DualBART): early stopping on dev BLEU
    stage1: TrainConfig  # TRICE stage 1 (single-source finetuning), its own early-stopped budget
    stage2: TrainConfig  # TRICE stage 2 (and every stage-2 variant of Tables 5-7 unless `analysis` is set)
    analysis: TrainConfig | None = None  # stage 2 of the Tables 5-7 variants and of their N_f = 1 reference
    #                                      (None = `stage2`, and APE's TRICE run is the reference)
    vocab_size: int = 8000  # the joint sentencepiece vocabulary of all tasks and languages
    pretrain_sentences: int = 0  # monolingual sentences per language side for stage 0 (0 = all)
    pretrain_copy_ratio: float = 0.2  # share of clean (unmasked) pre-training examples (msgcore.noising)
    heldout_sentences: int = 100  # clean sentences per language kept out of stage 0: the reconstruction gate
    fine_lr: float = 5e-4  # absolute peak learning rate of the new stage-2 parameters (authors: 5e-4)
    train_examples: int = 0  # first N training examples of each task (0 = all)
    eval_examples: int = 0  # first N sentences of each dev/test set (0 = all)
    analysis_examples: int = 0  # first N APE dev triplets scored in the analyses, Tables 5-7 (0 = all)
    ted_test_documents: int = 0  # first N documents of the TED test set (0 = all 23)
    ted_systems: bool = True  # train and test Table 4's systems (the TED denoiser gate is measured either way)
    beam_size: int = 5  # test-time beam (1 = greedy)
    seeds: tuple[int, ...] = (0,)  # seeds of the main comparison (Table 3: DualBART vs TRICE)
    budget_total: int = 0  # the budget-split analysis: stage 1 + stage 2 updates in all (0 = skip it)
    budget_splits: tuple[int, ...] = ()  # stage-1 shares of budget_total, in updates
    notes: str = ""  # what a reader should know about this scale


def _ft(steps: int, every: int = 0, patience: int = 0, **kw) -> TrainConfig:
    """A finetuning config: at most `steps` updates, dev BLEU every `every` updates (default: at the end),
    early stopping after `patience` validations without improvement (0 = none)."""
    base = dict(lr=5e-4, warmup_steps=max(min(steps // 10, 400), 1), max_tokens=1536, max_epochs=1000,
                max_steps=steps, validate_every=every or steps, patience=patience, valid_max_sentences=200,
                log_every=max(min(steps // 10, 100), 1), progress=False)
    return TrainConfig(**{**base, **kw})


TRICE_SCALES: dict[str, TriceScale] = {
    "smoke": TriceScale(
        "tiny", dict(d_model=64, d_ff=128, n_heads=2, dropout=0.1),
        pretrain=_ft(30, max_tokens=1024, lr=2e-3, valid_max_sentences=20),
        finetune=_ft(8, max_tokens=1024, valid_max_sentences=10),
        stage1=_ft(4, max_tokens=1024, valid_max_sentences=10), stage2=_ft(4, max_tokens=1024, valid_max_sentences=10),
        vocab_size=1000, pretrain_sentences=600, heldout_sentences=10, train_examples=300, eval_examples=12,
        beam_size=1, analysis_examples=12, ted_test_documents=1, budget_total=8, budget_splits=(0, 4),
        notes="CI only: checks that the chapter runs end to end; its numbers mean nothing."),
    "small": TriceScale(
        "tiny", dict(dropout=0.1),
        pretrain=_ft(2400, every=600, max_tokens=2048, lr=2e-3, warmup_steps=150, valid_max_sentences=200),
        finetune=_ft(300, every=100, patience=1, lr=5e-4, valid_max_sentences=100),
        stage1=_ft(150, every=75, patience=1, lr=5e-4, valid_max_sentences=100),
        stage2=_ft(250, every=125, patience=1, lr=5e-4, valid_max_sentences=100),
        analysis=_ft(100, lr=5e-4, valid_max_sentences=100),
        vocab_size=6000, pretrain_sentences=12000, heldout_sentences=50, pretrain_copy_ratio=0.5, fine_lr=1e-3,
        beam_size=1, analysis_examples=300, ted_test_documents=6, ted_systems=False, seeds=(0, 1, 2),
        budget_total=160, budget_splits=(0, 60),
        notes="2 CPU threads: the `tiny` preset (2M parameters), at most 2,400 denoising updates (the checkpoint "
              "that reconstructs held-out text best is kept), then every finetuning run early-stopped on dev BLEU "
              "within its own cap (300 updates; TRICE 150 + 250); the Tables 5-7 variants get 100 stage-2 updates "
              "each, beside an N_f = 1 reference on the same budget; greedy decoding. Table 4's TED systems are "
              "not trained at this scale (the 30-minute budget goes to the main comparison; the TED denoiser gate "
              "is still measured). About 7,000 updates in all: 26-29 minutes on 2 quiet threads."),
    "full": TriceScale(
        "small", dict(dropout=0.1),
        pretrain=_ft(30000, every=3000, max_tokens=8192, lr=7e-4, warmup_steps=2000, valid_max_sentences=500),
        finetune=_ft(8000, every=500, patience=4, max_tokens=4096, lr=2e-4, valid_max_sentences=0),
        stage1=_ft(8000, every=500, patience=4, max_tokens=4096, lr=2e-4, valid_max_sentences=0),
        stage2=_ft(8000, every=500, patience=4, max_tokens=4096, lr=2e-4, valid_max_sentences=0),
        vocab_size=8000, heldout_sentences=200, fine_lr=1e-3, beam_size=4, seeds=(0, 1, 2), budget_total=4000,
        budget_splits=(0, 1000, 2000),
        notes="One GPU, bf16: every stage trains to early stopping on dev BLEU, as in the paper; beam 4."),
}


# ---- data: three tasks, one tokenizer ----------------------------------------------------------------

@dataclass
class TriceTasks:
    """The corpora of every experiment, encoded with one joint tokenizer."""

    tokenizer: Tokenizer
    tasks: dict[str, TranslationData]  # name -> data (see `load_task_corpora`)
    monolingual: dict[str, list[str]] = field(default_factory=dict)  # language -> pre-training text
    synthetic: bool = False  # True when the toy tasks stood in for the real data (offline smoke runs)


def single_source(corpus: Corpus, k: int) -> Corpus:
    """The same examples with only source k."""
    return replace(corpus, source_langs=(corpus.source_langs[k],), sources=[corpus.sources[k]])


def joined_pair(corpus: Corpus, context_targets: list[str]) -> Corpus:
    """MBART-DOCTRANS data: "previous <sep> current" in both languages (two sentences in, two out)."""
    source = [f"{prev} {SEP_PIECE} {cur}" for prev, cur in zip(*corpus.sources)]
    target = [f"{prev} {SEP_PIECE} {cur}" for prev, cur in zip(context_targets, corpus.target)]
    return replace(corpus, source_langs=corpus.source_langs[1:], sources=[source], target=target)


def previous_targets(corpus: Corpus) -> list[str]:
    """The reference translation of each example's previous sentence in its document ("" for the first)."""
    out = []
    for i, doc in enumerate(corpus.doc_ids):
        out.append(corpus.target[i - 1] if i > 0 and corpus.doc_ids[i - 1] == doc else "")
    return out


def split_documents_at(corpus: Corpus, valid_docs: int) -> tuple[Corpus, Corpus]:
    """Train on all but the last `valid_docs` documents; those are the validation set."""
    last = sorted(set(corpus.doc_ids))[-valid_docs:]
    train = [i for i, d in enumerate(corpus.doc_ids) if d not in last]
    valid = [i for i, d in enumerate(corpus.doc_ids) if d in last]
    return replace(corpus.subset(train), split="train"), replace(corpus.subset(valid), split="val")


def real_task_corpora() -> dict[str, dict[str, Corpus]]:
    """task -> split -> corpus for the three real tasks (see `load_task_corpora`)."""
    m30k = {s: load_multi30k(s, sources=("de", "fr"), target="en")
            for s in ("train", "val", "test_2016_flickr", "test_2017_flickr")}
    ape = {"train": load_ape("train"), "val": load_ape("dev"), "test": load_ape("test")}
    ted_train, ted_val = split_documents_at(load_doc_level("dev", "ted"), valid_docs=5)
    ted = {"train": ted_train, "val": ted_val, "test": load_doc_level("test", "ted")}
    return {"m30k": m30k, "ape": ape, "ted": ted}


def synthetic_task_corpora(seed: int = 0) -> dict[str, dict[str, Corpus]]:
    """The offline stand-in for smoke runs: three two-source toy tasks (msgcore.data.synthetic_corpus)
    under the real tasks' split names; the TED stand-in is cut into documents of 10 sentences."""
    def toy(n: int, split: str, name: str, offset: int, documents: bool = False) -> Corpus:
        corpus = synthetic_corpus(n, num_sources=2, seed=seed + offset, split=split)
        return replace(corpus, split=name, doc_ids=[i // 10 for i in range(n)] if documents else None)

    m30k = {"train": toy(1000, "train", "train", 0), "val": toy(100, "val", "val", 0),
            "test_2016_flickr": toy(100, "test", "test_2016_flickr", 0),
            "test_2017_flickr": toy(100, "test", "test_2017_flickr", 1)}
    ape = {"train": toy(1000, "train", "train", 2), "val": toy(100, "val", "val", 2), "test": toy(100, "test", "test", 2)}
    ted_train, ted_val = split_documents_at(toy(600, "train", "train", 3, documents=True), valid_docs=5)
    ted = {"train": ted_train, "val": ted_val, "test": toy(100, "test", "test", 3, documents=True)}
    return {"m30k": m30k, "ape": ape, "ted": ted}


def load_task_corpora(scale: TriceScale, seed: int = 0,
                      allow_synthetic: bool = False) -> tuple[dict[str, dict[str, Corpus]], bool]:
    """(task -> split -> corpus, synthetic). Every task has "train" and "val" (its dev set) and its test sets.

    m30k     Multi30k De+Fr -> En; m30k_de / m30k_fr the single-source views
    ape      WMT16/17 APE (src en, mt de) -> pe de; "val" is the deterministic dev split
    ted      TED (previous de, current de) -> en; trains on the TED dev set minus its last 5
             documents (validation) and tests on the TED test set (the training set is not public)
    ted_sent current de -> en;  ted_doc "previous <sep> current" -> "previous <sep> current" (en)
    With `allow_synthetic`, a machine with neither the data nor a mirror nor the network gets the toy
    tasks of `synthetic_task_corpora` instead (smoke runs only), and is told so.
    """
    try:
        tasks, synthetic = real_task_corpora(), False
    except DataError as error:
        if not allow_synthetic or "MSGCORE_DATA_MIRROR" not in str(error):
            raise
        print(f"The real data is unavailable ({error}); using the synthetic tasks instead.")
        tasks, synthetic = synthetic_task_corpora(seed), True
    if scale.ted_test_documents:
        test = tasks["ted"]["test"]
        kept = sorted(set(test.doc_ids))[:scale.ted_test_documents]
        tasks["ted"]["test"] = test.subset(i for i, doc in enumerate(test.doc_ids) if doc in kept)
    if scale.train_examples:
        for splits in tasks.values():
            splits["train"] = splits["train"].subset(range(min(scale.train_examples, len(splits["train"]))))
    if scale.eval_examples:
        for splits in tasks.values():
            for name in splits:
                if name != "train":
                    splits[name] = splits[name].subset(range(min(scale.eval_examples, len(splits[name]))))
    m30k = tasks["m30k"]
    tasks["m30k_de"] = {s: single_source(c, 0) for s, c in m30k.items()}
    tasks["m30k_fr"] = {s: single_source(c, 1) for s, c in m30k.items()}
    tasks["ted_sent"] = {s: single_source(c, 1) for s, c in tasks["ted"].items()}
    tasks["ted_doc"] = {s: joined_pair(c, previous_targets(c)) for s, c in tasks["ted"].items()}
    return tasks, synthetic


def monolingual_text(tasks: dict[str, dict[str, Corpus]], limit: int,
                     extra: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Stage-0 text: every language side of the training splits (Multi30k, APE, TED) and the `extra`
    columns (Multi30k's Czech side). Each language gets at most `limit` sentences (0 = all), drawn
    evenly from its sources."""
    columns: dict[str, list[list[str]]] = {}
    for name in ("m30k", "ape", "ted"):
        train = tasks[name]["train"]
        for lang, column in zip((*train.source_langs, train.target_lang), (*train.sources, train.target)):
            columns.setdefault(lang, []).append([s for s in column if s.strip()])
    for lang, column in (extra or {}).items():
        columns.setdefault(lang, []).append(column)
    text = {}
    for lang, parts in columns.items():
        per_part = limit // len(parts) if limit else None
        text[lang] = [s for part in parts for s in part[:per_part]]
    return text


def encode_task(corpus: Corpus, tokenizer: Tokenizer, max_len: int | None = None) -> EncodedCorpus:
    """A task in the pre-training layout, language tags kept (mBART, authors' code): each source
    "pieces </s> <src_lang>", the decoder "<s> <tgt_lang> pieces" (msgcore.noising)."""
    def pieces(column):
        return [ids[:max_len] if max_len else ids for ids in tokenizer.encode_batch(list(column))]

    sources = [[tagged_source(ids, tokenizer, lang) for ids in pieces(column)]
               for lang, column in zip(corpus.source_langs, corpus.sources)]
    target = [tagged_target(ids, tokenizer, corpus.target_lang) for ids in pieces(corpus.target)]
    return EncodedCorpus(sources, target, tokenizer.bos_id, tokenizer.eos_id)


def prepare_tasks(scale: TriceScale, seed: int = 0, allow_synthetic: bool = False) -> TriceTasks:
    """Load every task, train the joint tokenizer on the stage-0 text, and encode every split.

    `allow_synthetic`: fall back to the toy tasks when the real data cannot be had (smoke runs)."""
    corpora, synthetic = load_task_corpora(scale, seed, allow_synthetic)
    czech = {}
    if not synthetic:  # the Czech side of Multi30k, as many sentences as the De+Fr training set
        czech["cs"] = load_multi30k("train", sources=("cs",), target="en").sources[0][:len(corpora["m30k"]["train"])]
    mono = monolingual_text(corpora, scale.pretrain_sentences, czech)
    texts = [s for sentences in mono.values() for s in sentences]
    tokenizer = Tokenizer.train(texts, vocab_size=scale.vocab_size, langs=tuple(mono), symbols=(SEP_PIECE,),
                                seed=seed)
    tasks = {}
    for name, splits in corpora.items():
        encoded = {s: encode_task(c, tokenizer, max_len=128 if s == "train" else None) for s, c in splits.items()}
        tasks[name] = TranslationData(tokenizer, splits, encoded, synthetic=synthetic)
    return TriceTasks(tokenizer, tasks, mono, synthetic)


# ---- stage 0: the denoising stand-in for mBART ---------------------------------------------------------

def base_config(data: TranslationData, scale: TriceScale) -> TransformerConfig:
    return preset(scale.preset, vocab_size=data.tokenizer.vocab_size, pad_id=data.tokenizer.pad_id, **scale.model)


def model_config(data: TranslationData, scale: TriceScale, **trice_fields) -> TriceConfig:
    return TriceConfig(**{**base_config(data, scale).to_dict(), **trice_fields})


def copy_model(model: TriceTransformer) -> TriceTransformer:
    """A fresh model with the same weights (the pre-trained model stays untouched)."""
    clone = type(model)(model.cfg)
    clone.load_state_dict(model.state_dict())
    return clone


def split_heldout(texts: dict[str, list[str]], n: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(pre-training text, held-out clean text): the last `n` sentences of each language are held out."""
    return {lang: s[:-n] if n else list(s) for lang, s in texts.items()}, {lang: s[-n:] if n else [] for lang, s in texts.items()}


def denoising_data(tasks: TriceTasks, scale: TriceScale, seed: int = 0) -> TranslationData:
    """Stage 0's data: noised -> clean on the monolingual text; its dev set is clean -> clean on held-out
    sentences, so that dev BLEU is the reconstruction BLEU that picks the best checkpoint."""
    train_text, heldout = split_heldout(tasks.monolingual, scale.heldout_sentences)
    train = denoising_corpus(train_text, tasks.tokenizer, seed=seed, copy_ratio=scale.pretrain_copy_ratio)
    refs = [s for sentences in heldout.values() for s in sentences]
    val = Corpus("monolingual", "val", ("any",), "any", [refs], refs)
    return TranslationData(tasks.tokenizer, {"val": val},
                           {"train": train, "val": copy_corpus(heldout, tasks.tokenizer)}, synthetic=tasks.synthetic)


def pretrain(tasks: TriceTasks, scale: TriceScale, device: torch.device, out_dir: Path, seed: int = 0) -> RunResult:
    """Stage 0: mBART-style denoising (msgcore.noising) with a TRICE model of one source and no fine encoder,
    so that every later stage loads it whole (embedding LayerNorm included). Goes through the run cache."""
    data = denoising_data(tasks, scale, seed)
    torch.manual_seed(seed)
    model = TriceTransformer(model_config(tasks.tasks["m30k"], scale, fine_layers=0))
    return train_model(model, data, replace(scale.pretrain, seed=seed), device, out_dir)


@dataclass
class Denoiser:
    """The pre-trained stand-in for mBART and everything needed to finetune it (chapters 1, 3 and 4)."""

    model: TriceTransformer  # single-source, no fine encoder; copy it before finetuning (`copy_model`)
    tokenizer: Tokenizer  # the joint tokenizer of every task and language (with language tags and <sep>)
    tasks: TriceTasks  # the encoded tasks (Multi30k De+Fr->En, APE, TED) and the pre-training text
    run: RunResult  # the pre-training run (its history; `reused` when it came from the run cache)
    scale: TriceScale


def pretrained_denoiser(scale_name: str, device: torch.device, seed: int = 0, out_dir: str | Path = "runs/denoiser",
                        tasks: TriceTasks | None = None) -> Denoiser:
    """The chapter's denoising pre-trained model at a scale, trained once and then reused from the run cache
    (a later chapter asks for the same scale and seed and gets the cached model)."""
    scale = get_scale(TRICE_SCALES, scale_name)
    tasks = tasks or prepare_tasks(scale, seed, allow_synthetic=scale_name == "smoke")
    run = pretrain(tasks, scale, device, Path(out_dir), seed)
    return Denoiser(run.model, tasks.tokenizer, tasks, run, scale)


def reconstruction_bleu(model, tokenizer: Tokenizer, texts: dict[str, list[str]], device: torch.device,
                        beam_size: int = 1) -> dict[str, float]:
    """The denoiser gate: BLEU of the model's output against its own clean input, per language."""
    out = {}
    for lang, sentences in texts.items():
        if sentences:
            hyps = translate_encoded(model, tokenizer, copy_corpus({lang: sentences}, tokenizer), device,
                                     GenerationConfig(beam_size=beam_size))
            out[lang] = corpus_score("bleu", hyps, list(sentences)).score
    return out


# ---- stages 1 and 2, and the systems ------------------------------------------------------------------

def single_source_encoded(encoded: EncodedCorpus, seed: int) -> EncodedCorpus:
    """Stage-1 data (§2.2): each example keeps one source, drawn with probability 1/K; every source keeps
    its own language tag (they are part of each encoded source)."""
    rng = random.Random(f"trice-ssg:{seed}")
    picks = [rng.randrange(len(encoded.sources)) for _ in range(len(encoded))]
    column = [encoded.sources[k][i] for i, k in enumerate(picks)]
    return EncodedCorpus([column], encoded.target, encoded.target_prefix, encoded.eos_id)


def stage2_config(scale: TriceScale, train_cfg: TrainConfig) -> dict:
    """The learning rates the TRICE model needs to know: the trainer's peak lr and the absolute fine lr."""
    return dict(base_lr=train_cfg.lr, fine_lr=scale.fine_lr)


def train_stage1(pretrained: TriceTransformer, data: TranslationData, scale: TriceScale, device: torch.device,
                 out_dir: Path, seed: int = 0, single: TranslationData | None = None,
                 train_cfg: TrainConfig | None = None) -> RunResult:
    """Stage 1 (§2.2): the pre-trained model finetuned on single-source examples: one source drawn
    per example (probability 1/K), or the given single-source task `single`."""
    cfg = replace(train_cfg or scale.stage1, seed=seed)
    if single is not None:
        return train_model(copy_model(pretrained), single, cfg, device, out_dir)
    return train_model(copy_model(pretrained), data, cfg, device, out_dir,
                       train=single_source_encoded(data.encoded["train"], seed),
                       valid=single_source_encoded(data.encoded["val"], seed))


def train_stage2(stage1: TriceTransformer, data: TranslationData, scale: TriceScale, device: torch.device,
                 out_dir: Path, seed: int = 0, train_cfg: TrainConfig | None = None, freeze_old: bool = False,
                 **trice_fields) -> RunResult:
    """Stage 2 (§2.2): a TRICE model (fine encoder new and random) from the stage-1 weights.

    `freeze_old` trains only the new parameters (Table 7, "fine encoder only")."""
    cfg = replace(train_cfg or scale.stage2, seed=seed)
    torch.manual_seed(seed)
    model = from_single_source(stage1, model_config(data, scale, **stage2_config(scale, cfg), **trice_fields))
    if freeze_old:
        new = set(model.new_parameter_names())
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name in new)
    return train_model(model, data, cfg, device, out_dir)


def train_trice(pretrained: TriceTransformer, data: TranslationData, scale: TriceScale, device: torch.device,
                out_dir: Path, seed: int = 0, single: TranslationData | None = None,
                stage1_cfg: TrainConfig | None = None, stage2_cfg: TrainConfig | None = None,
                **trice_fields) -> tuple[RunResult, RunResult]:
    """Stage 1 then stage 2, each on its own (early-stopped) budget; returns both runs (stage 2 is TRICE).

    # Deviation: for document-level translation stage 1 trains on the current sentence only
    # (`single`): drawing the previous sentence as the only source of the current sentence's
    # translation would teach the model to hallucinate.
    """
    stage1 = train_stage1(pretrained, data, scale, device, out_dir / "stage1", seed, single, stage1_cfg)
    stage2 = train_stage2(stage1.model, data, scale, device, out_dir / "stage2", seed, stage2_cfg, **trice_fields)
    return stage1, stage2


def train_dualbart(pretrained: TriceTransformer, data: TranslationData, scale: TriceScale, device: torch.device,
                   out_dir: Path, seed: int = 0) -> RunResult:
    """The pre-trained model finetuned directly on the concatenated sources (each with its language tag;
    no segment embedding, no fine encoder, one joint cross-attention)."""
    cfg = model_config(data, scale, fine_layers=0, separated_cross_attention=False, segment_embedding=False)
    return train_model(from_single_source(pretrained, cfg), data, replace(scale.finetune, seed=seed), device, out_dir)


def train_dualtrans(data: TranslationData, scale: TriceScale, device: torch.device, out_dir: Path,
                    seed: int = 0) -> RunResult:
    """A multi-source Transformer trained from scratch (no pre-training), on the same budget rule."""
    torch.manual_seed(seed)
    model = TriceTransformer(model_config(data, scale, fine_layers=0, concatenated_encoding=False))
    return train_model(model, data, replace(scale.finetune, seed=seed), device, out_dir)


def train_mbart_trans(pretrained: TriceTransformer, single_source: TranslationData, scale: TriceScale,
                      device: torch.device, out_dir: Path, seed: int = 0) -> RunResult:
    """The pre-trained model finetuned on one source (`single_source` holds that direction)."""
    return train_model(copy_model(pretrained), single_source, replace(scale.finetune, seed=seed), device, out_dir)


def fixed_steps(cfg: TrainConfig, steps: int) -> TrainConfig:
    """`cfg` for exactly `steps` updates, validated once at the end (the budget-split analysis)."""
    return replace(cfg, max_steps=max(steps, 1), validate_every=max(steps, 1), patience=0,
                   warmup_steps=max(min(cfg.warmup_steps, steps // 10), 1), log_every=max(steps // 10, 1))


def updates(run: RunResult) -> int:
    """Updates a run trained for (its best checkpoint may be earlier: see `best_update`)."""
    return max((r["step"] for r in run.history), default=0)


def best_update(run: RunResult) -> int:
    """The update of the checkpoint kept (best dev BLEU)."""
    valid = [r for r in run.history if r["kind"] == "valid"]
    return max(valid, key=lambda r: r["valid_bleu"])["step"] if valid else updates(run)


# ---- evaluation ---------------------------------------------------------------------------------

def translate(model, data: TranslationData, split: str, scale: TriceScale, device: torch.device,
              sources: list[list[str]] | None = None) -> list[str]:
    """Decode a split (or the same split with `sources` replaced, for Table 8)."""
    encoded = data.encoded[split]
    if sources is not None:
        corpus = replace(data.corpora[split], sources=sources)
        encoded = encode_task(corpus, data.tokenizer)
    return translate_encoded(model, data.tokenizer, encoded, device, GenerationConfig(beam_size=scale.beam_size))


def scores(hyps: list[str], refs: list[str], metrics=("bleu", "chrf")) -> dict[str, float]:
    """Cased, detokenized sacreBLEU scores: {"BLEU": ..., "chrF": ..., "TER": ...}."""
    names = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER"}
    return {names[m]: corpus_score(m, hyps, refs).score for m in metrics}


def current_sentence(hypothesis: str) -> str:
    """MBART-DOCTRANS outputs "previous <sep> current": keep the current sentence (everything when
    the model emitted no separator)."""
    return hypothesis.split(SEP_PIECE)[-1].strip()


def document_bleu(hyps: list[str], refs: list[str], doc_ids: list[int]) -> float:
    """d-BLEU: BLEU over whole documents, each the concatenation of its sentences (Liu et al. 2020)."""
    docs_h: dict[int, list[str]] = {}
    docs_r: dict[int, list[str]] = {}
    for h, r, d in zip(hyps, refs, doc_ids):
        docs_h.setdefault(d, []).append(h)
        docs_r.setdefault(d, []).append(r)
    order = sorted(docs_h)
    return corpus_score("bleu", [" ".join(docs_h[d]) for d in order], [" ".join(docs_r[d]) for d in order]).score


def shuffled_source(corpus: Corpus, k: int, seed: int = 0) -> list[list[str]]:
    """Table 8: source k replaced by a random other sentence of the same set (a derangement)."""
    n = len(corpus)
    if n < 2:
        raise MsgcoreError("a shuffled source needs at least 2 sentences")
    rng = random.Random(f"adversarial:{seed}")
    offset = rng.randrange(1, n)
    order = list(range(n))
    rng.shuffle(order)
    replacement = [""] * n
    for i, j in enumerate(order):
        replacement[j] = corpus.sources[k][order[(i + offset) % n]]  # never the sentence itself
    return [replacement if j == k else list(column) for j, column in enumerate(corpus.sources)]


def ter_scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """APE scores: TER cased (as the paper's tercom) and case-insensitive (sacreBLEU's default), cased BLEU."""
    return {"TER": corpus_score("ter", hyps, refs, case_sensitive=True).score,
            "TER (uncased)": corpus_score("ter", hyps, refs).score,
            "BLEU": corpus_score("bleu", hyps, refs).score}


# ---- the chapter's runs, section by section (the notebook and `run_chapter` call the same functions) -----

@dataclass
class Chapter:
    """What every section needs: the scale, the data, the pre-trained model, where the runs go."""

    scale: TriceScale
    denoiser: Denoiser
    device: torch.device
    out_dir: Path
    seed: int = 0

    @property
    def tasks(self) -> dict[str, TranslationData]:
        return self.denoiser.tasks.tasks

    @property
    def pretrained(self) -> TriceTransformer:
        return self.denoiser.model

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.seed + s for s in self.scale.seeds)


def start_chapter(scale_name: str, device: torch.device, out_dir: str | Path, seed: int = 0) -> Chapter:
    """Data, tokenizer and the pre-trained denoiser (from the run cache when it was trained before)."""
    denoiser = pretrained_denoiser(scale_name, device, seed, Path(out_dir) / "pretrain")
    return Chapter(denoiser.scale, denoiser, device, Path(out_dir), seed)


def multi30k_runs(ch: Chapter) -> dict[tuple[str, int], RunResult]:
    """Table 3: (system, seed) -> run. DualBART and TRICE on every seed; the others on the first."""
    m30k, out, s0 = ch.tasks["m30k"], ch.out_dir, ch.seed
    runs = {("DualTrans", s0): train_dualtrans(m30k, ch.scale, ch.device, out / "dualtrans", s0)}
    for system, task in MULTI30K_SINGLE.items():
        runs[system, s0] = train_mbart_trans(ch.pretrained, ch.tasks[task], ch.scale, ch.device,
                                             out / f"mbart-{task[-2:]}", s0)
    for s in ch.seeds:
        runs["DualBART", s] = train_dualbart(ch.pretrained, m30k, ch.scale, ch.device, out / f"dualbart-{s}", s)
        runs["TRICE stage 1", s], runs["TRICE", s] = train_trice(ch.pretrained, m30k, ch.scale, ch.device,
                                                                 out / f"trice-{s}", s)
    return runs


def budget_split_runs(ch: Chapter) -> dict[int, RunResult]:
    """The budget-split analysis on Multi30k (first seed): stage-1 updates -> TRICE trained on exactly
    `budget_total` updates in all (stage 1 + stage 2, no early stopping); 0 = no stage 1."""
    total, m30k, runs = ch.scale.budget_total, ch.tasks["m30k"], {}
    for first in ch.scale.budget_splits:
        out = ch.out_dir / f"budget-{first}"
        stage1 = (train_stage1(ch.pretrained, m30k, ch.scale, ch.device, out / "stage1", ch.seed,
                               train_cfg=fixed_steps(ch.scale.stage1, first)).model if first else ch.pretrained)
        runs[first] = train_stage2(stage1, m30k, ch.scale, ch.device, out / "stage2", ch.seed,
                                   train_cfg=fixed_steps(ch.scale.stage2, total - first))
    return runs


def dualbart_fixed(ch: Chapter) -> RunResult:
    """DualBART on exactly `budget_total` updates: the budget-split analysis's reference."""
    return train_model(from_single_source(ch.pretrained, model_config(
        ch.tasks["m30k"], ch.scale, fine_layers=0, separated_cross_attention=False, segment_embedding=False)),
        ch.tasks["m30k"], replace(fixed_steps(ch.scale.finetune, ch.scale.budget_total), seed=ch.seed),
        ch.device, ch.out_dir / "budget-dualbart")


def ape_runs(ch: Chapter) -> dict[str, RunResult]:
    """Table 2 (one seed): DualTrans, DualBART, TRICE stage 1 and TRICE on the APE triplets."""
    ape, out = ch.tasks["ape"], ch.out_dir
    runs = {"DualTrans": train_dualtrans(ape, ch.scale, ch.device, out / "ape-dualtrans", ch.seed),
            "DualBART": train_dualbart(ch.pretrained, ape, ch.scale, ch.device, out / "ape-dualbart", ch.seed)}
    runs["TRICE stage 1"], runs["TRICE"] = train_trice(ch.pretrained, ape, ch.scale, ch.device, out / "ape-trice",
                                                       ch.seed)
    return runs


def ted_runs(ch: Chapter) -> dict[str, tuple[RunResult, TranslationData]]:
    """Table 4 (one seed): name -> (run, the data it reads)."""
    ted, sent, doc, out = ch.tasks["ted"], ch.tasks["ted_sent"], ch.tasks["ted_doc"], ch.out_dir
    return {"MBART-TRANS": (train_mbart_trans(ch.pretrained, sent, ch.scale, ch.device, out / "ted-mbart", ch.seed), sent),
            "MBART-DOCTRANS": (train_mbart_trans(ch.pretrained, doc, ch.scale, ch.device, out / "ted-doc", ch.seed), doc),
            "DualBART": (train_dualbart(ch.pretrained, ted, ch.scale, ch.device, out / "ted-dualbart", ch.seed), ted),
            "TRICE": (train_trice(ch.pretrained, ted, ch.scale, ch.device, out / "ted-trice", ch.seed,
                                  single=sent)[1], ted)}


# Tables 5-7: stage-2 variants on the APE task, all from the same APE stage-1 model (one seed each).
ANALYSIS_VARIANTS = {
    "None": dict(fine_layers=0),
    "FFN adapter": dict(fine_layers=0, encoder_adapters=True),
    "Fine encoder (N_f = 1) w/o CA": dict(fine_cross_attention=False),
    "Fine encoder (N_f = 2)": dict(fine_layers=2),
    "Fine encoder (N_f = 3)": dict(fine_layers=3),
    "– separated cross-attention": dict(separated_cross_attention=False),
    "– concatenated encoding": dict(concatenated_encoding=False),
    "– segment embedding": dict(segment_embedding=False),
}


def analysis_runs(ch: Chapter, ape: dict[str, RunResult]) -> dict[str, RunResult]:
    """Tables 5-7: name -> stage-2 run on APE, each on the scale's `analysis` budget (default: stage 2's).
    "Fine encoder (N_f = 1)" is TRICE itself (all parameters): APE's TRICE run, or a run of its own when the
    analysis budget differs; "– gradual finetuning" starts stage 2 from the pre-trained model; "The fine
    encoder" freezes the rest."""
    stage1, data, out, cfg = ape["TRICE stage 1"].model, ch.tasks["ape"], ch.out_dir, ch.scale.analysis
    runs = {name: train_stage2(stage1, data, ch.scale, ch.device, out / f"ape-var-{i}", ch.seed, cfg, **fields)
            for i, (name, fields) in enumerate(ANALYSIS_VARIANTS.items())}
    runs["Fine encoder (N_f = 1)"] = ape["TRICE"] if cfg is None else train_stage2(
        stage1, data, ch.scale, ch.device, out / "ape-var-reference", ch.seed, cfg)
    runs["– gradual finetuning"] = train_stage2(ch.pretrained, data, ch.scale, ch.device, out / "ape-no-gradual",
                                                ch.seed, cfg)
    runs["The fine encoder"] = train_stage2(stage1, data, ch.scale, ch.device, out / "ape-fine-only", ch.seed, cfg,
                                            freeze_old=True)
    return runs


def run_chapter(scale_name: str, device: torch.device, out_dir: str | Path, seed: int = 0) -> dict:
    """Every training run of chapter 1, through the run cache (`python -m msgcore.experiments ch01`)."""
    ch = start_chapter(scale_name, device, out_dir, seed)
    ape = ape_runs(ch)
    runs = {"chapter": ch, "m30k": multi30k_runs(ch), "ape": ape, "analysis": analysis_runs(ch, ape)}
    if ch.scale.ted_systems:
        runs["ted"] = ted_runs(ch)
    if ch.scale.budget_total:
        runs["budget"], runs["budget DualBART"] = budget_split_runs(ch), dualbart_fixed(ch)
    return runs


def task_text(corpus: Corpus, n: int = 0) -> dict[str, list[str]]:
    """Each language of a (dev) corpus, its first `n` sentences (0 = all): text the denoiser never saw in
    pre-training (stage 0 reads training splits only). A language on two sides keeps its first column:
    APE's German is the MT (the text an APE system copies), TED's the previous sentence."""
    text: dict[str, list[str]] = {}
    for lang, column in zip((*corpus.source_langs, corpus.target_lang), (*corpus.sources, corpus.target)):
        text.setdefault(lang, [s for s in column[:n or None] if s.strip()])  # the first column of a language
    return text


# The denoiser gate, per task: a task's claims need a pre-trained model that copies that task's own text.
GATE_TASKS = {"Multi30k": "m30k", "APE": "ape", "TED": "ted"}


def denoiser_gates(ch: Chapter) -> dict[str, dict[str, float]]:
    """Reconstruction BLEU of the pre-trained model on clean dev text, per task and language side:
    {"Multi30k": {"de": ..., "fr": ..., "en": ...}, "APE": {"en": ..., "de": ...}, "TED": {...}}.

    # Deviation: the issue's gate asks >= 90 on held-out clean sentences; we ask it per task, on that
    # task's dev text, so that a denoiser that copies short captions but not 40-word TED lines withholds
    # only the TED verdicts. The pre-training dev curve (held-out training-domain text) is shown beside it.
    """
    n = ch.scale.analysis_examples
    return {name: reconstruction_bleu(ch.pretrained, ch.denoiser.tokenizer, task_text(ch.tasks[task].corpora["val"], n),
                                      ch.device)
            for name, task in GATE_TASKS.items()}


# Table 3's single-source systems read their own source; every other system reads both.
MULTI30K_SINGLE = {"MBART-TRANS (De)": "m30k_de", "MBART-TRANS (Fr)": "m30k_fr"}


def multi30k_data(ch: Chapter, system: str) -> TranslationData:
    """The data a Table-3 system was trained on, and so the data it is tested on."""
    return ch.tasks[MULTI30K_SINGLE.get(system, "m30k")]


# ---- the paper's numbers (Huang et al. 2021, read from the paper's text; /work/shared/papers) ------------

PAPER_TABLES = {
    # Table 2, WMT APE En-De, "extremely low-resource" (23K triplets). FORCEDATT's TEST16 BLEU is "—" in the text.
    "table2": {"FORCEDATT": {"TEST16 TER": 22.89, "TEST16 BLEU": None, "TEST17 TER": 23.08, "TEST17 BLEU": 65.57},
               "DUALBERT": {"TEST16 TER": 18.88, "TEST16 BLEU": 71.61, "TEST17 TER": 19.03, "TEST17 BLEU": 70.66},
               "DUALBART": {"TEST16 TER": 18.26, "TEST16 BLEU": 72.65, "TEST17 TER": 18.41, "TEST17 BLEU": 72.08},
               "TRICE": {"TEST16 TER": 17.41, "TEST16 BLEU": 73.43, "TEST17 TER": 17.75, "TEST17 BLEU": 72.70}},
    # Table 2, "high-resource" (+8M pseudo triplets), for reference only.
    "table2_high": {"DUALTRANS": {"TEST16 TER": 17.81, "TEST16 BLEU": 72.79, "TEST17 TER": 18.10, "TEST17 BLEU": 71.72},
                    "DUALBART": {"TEST16 TER": 16.40, "TEST16 BLEU": 74.74, "TEST17 TER": 17.26, "TEST17 BLEU": 73.56},
                    "TRICE": {"TEST16 TER": 16.09, "TEST16 BLEU": 75.39, "TEST17 TER": 16.91, "TEST17 BLEU": 74.09}},
    # Table 3, WMT14 subset De+Fr->En, sacreBLEU on test14.
    "table3": {"MULTIRNN": 30.0, "DualTrans": 37.0, "MBART-TRANS (De)": 31.8, "MBART-TRANS (Fr)": 34.8,
               "DualBART": 40.2, "TRICE": 41.5},
    # Table 4, TED (IWSLT17) De->En, s-BLEU and d-BLEU.
    "table4": {"MBART-TRANS": {"s-BLEU": 28.1, "d-BLEU": 31.7}, "MBART-DOCTRANS": {"s-BLEU": 28.1, "d-BLEU": 31.7},
               "DualBART": {"s-BLEU": 27.8, "d-BLEU": 31.4}, "TRICE": {"s-BLEU": 28.5, "d-BLEU": 32.1}},
    # Table 5, APE dev BLEU (cased), variants of the fine encoder; "#Para." of the new parameters.
    "table5": {"None": {"#Para.": "0M", "BLEU": 73.65}, "FFN adapter": {"#Para.": "100.7M", "BLEU": 73.71},
               "Fine encoder (N_f = 1) w/o CA": {"#Para.": "12.5M", "BLEU": 73.84},
               "Fine encoder (N_f = 1)": {"#Para.": "16.8M", "BLEU": 74.21},
               "Fine encoder (N_f = 2)": {"#Para.": "33.6M", "BLEU": 73.70},
               "Fine encoder (N_f = 3)": {"#Para.": "50.4M", "BLEU": 58.84}},
    # Table 6, APE dev BLEU, one component removed at a time.
    "table6": {"TRICE": 74.21, "– gradual finetuning": 73.83, "– separated cross-attention": 73.81,
               "– concatenated encoding": 73.61, "– segment embedding": 72.92},
    # Table 7, APE dev BLEU, which parameters stage 2 trains.
    "table7": {"All": 74.21, "The fine encoder": 70.20},
    # Table 8, test14 BLEU / METEOR with one source replaced by a random sentence.
    "table8": {"DualBART": {"Normal": 40.2, "Randomized Fr": 11.3, "Randomized De": 24.9},
               "TRICE": {"Normal": 41.5, "Randomized Fr": 13.5, "Randomized De": 23.0}},
}
