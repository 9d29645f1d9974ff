"""The multilingual denoising model: a small stand-in for mBART-cc25 (Liu et al., 2020), shared by chapters 1, 3 and 4.

mBART pre-trains a sequence-to-sequence Transformer by denoising: spans with Poisson(3.5) lengths, about 35% of the
tokens in all, are replaced by one `<mask>` each, the language tag ends the input, and the model reconstructs the
sentence (`msgcore.noising`). The book's stand-in does the same on every language side of the book's training text,
with one joint SentencePiece model for all tasks and languages, as mBART-cc25 serves every task of the TRICE paper.

    Tasks      Multi30k De+Fr -> En, WMT16/17 APE (src en + mt de -> pe de) and TED (previous de + current de -> en),
               encoded once with the joint tokenizer, in the pre-training layout (language tags kept)
    pretrain   stage 0: the denoising run, through the run cache (trained once, reused by every chapter)
    Denoiser   the pre-trained model, its tokenizer, the tasks and the run

The model is a TRICE model (`msgcore.models.trice`) of one source and no fine encoder, so that every chapter loads
it whole (the embedding LayerNorm included) and adds what its own paper adds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch

from msgcore.batching import EncodedCorpus
from msgcore.data import Corpus, load_ape, load_doc_level, load_mlqe_pe, load_multi30k, synthetic_corpus
from msgcore.generation import GenerationConfig
from msgcore.metrics import corpus_score
from msgcore.model import TransformerConfig, preset
from msgcore.models.trice import TriceConfig, TriceTransformer
from msgcore.noising import copy_corpus, denoising_corpus, tagged_source, tagged_target
from msgcore.recipes import CPU_BOOK_SETTING, RunResult, TranslationData, get_scale, train_model
from msgcore.tokenizer import SEP_PIECE, Tokenizer
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import DataError


@dataclass
class DenoiserScale:
    """Everything a scale changes for the denoiser and the task data every chapter fine-tunes on."""

    preset: str  # model preset (msgcore.model.PRESETS); every system built on the denoiser has its size
    model: dict  # preset overrides, e.g. dropout
    pretrain: TrainConfig  # the denoising run; validates on clean held-out sentences (copy BLEU)
    vocab_size: int = 8000  # the joint sentencepiece vocabulary of all tasks and languages
    pretrain_sentences: int = 0  # monolingual sentences per language side for pre-training (0 = all)
    pretrain_copy_ratio: float = 0.2  # share of clean (unmasked) pre-training examples (msgcore.noising)
    noise_draws: int = 1  # each pre-training sentence noised this many times, with different draws (mBART noises
    #                       afresh every epoch; a few draws keep a many-epoch run from learning one draw by heart)
    heldout_sentences: int = 100  # clean sentences per language kept out of pre-training: its dev set
    train_examples: int = 0  # first N training examples of each task (0 = all)
    eval_examples: int = 0  # first N sentences of each dev/test set (0 = all)
    ted_test_documents: int = 0  # first N documents of the TED test set (0 = all 23)
    notes: str = ""  # what a reader should know about this scale


def pretraining(steps: int, every: int, **kw) -> TrainConfig:
    """The denoising run's recipe: at most `steps` updates, reconstruction BLEU on the held-out text every `every`."""
    base = dict(lr=5e-4, warmup_steps=max(min(steps // 10, 400), 1), max_tokens=1536, max_epochs=1000,
                max_steps=steps, validate_every=every, patience=0, valid_max_sentences=200,
                log_every=max(min(steps // 10, 100), 1), progress=False)
    return TrainConfig(**{**base, **kw})


DENOISER_SCALES: dict[str, DenoiserScale] = {
    "smoke": DenoiserScale(
        "tiny", dict(d_model=64, d_ff=128, n_heads=2, dropout=0.1),
        pretraining(30, 30, max_tokens=1024, lr=2e-3, valid_max_sentences=20),
        vocab_size=1000, pretrain_sentences=600, heldout_sentences=10, train_examples=300, eval_examples=12,
        ted_test_documents=1, notes="CI only: checks that the chapters run end to end; its numbers mean nothing."),
    "small": DenoiserScale(
        "small", dict(dropout=0.1),
        pretraining(12000, 1000, max_tokens=4096, lr=1e-3, warmup_steps=1000, patience=3, valid_max_sentences=0,
                    **CPU_BOOK_SETTING),
        vocab_size=8000, heldout_sentences=100, pretrain_copy_ratio=0.2, noise_draws=4,
        notes="2 CPU threads, bf16 autocast and the math attention kernel: the `small` preset, as chapter 0's "
              "Transformer, pre-trained on all of the book's training-side text (each sentence noised four times) "
              "until reconstructing held-out noised text stops improving (3 validations every 1,000 updates, at most "
              "12,000 updates); that checkpoint is kept."),
    "full": DenoiserScale(
        "small", dict(dropout=0.1),
        pretraining(30000, 3000, max_tokens=8192, lr=7e-4, warmup_steps=2000, valid_max_sentences=500),
        vocab_size=8000, heldout_sentences=200, notes="One GPU: the `small` preset, 30,000 denoising updates."),
}


# ---- the tasks: three of them, one tokenizer ------------------------------------------------------------

@dataclass
class Tasks:
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


def load_task_corpora(scale: DenoiserScale, seed: int = 0,
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
                     extra: Sequence[tuple[str, Sequence[str]]] = ()) -> dict[str, list[str]]:
    """Stage-0 text: every language side of the training splits (Multi30k, APE, TED) and the `extra` (language,
    column) pairs (`extra_training_text`). Each language keeps each sentence once and gets at most `limit`
    sentences (0 = all), drawn evenly from its columns.

    # Deviation: the stand-in for mBART pre-trains on the fine-tuning tasks' own training text (each side alone,
    # noised), which mBART-cc25 never saw; at our scale there is no other text of these domains to pre-train on."""
    columns: dict[str, list[list[str]]] = {}
    for name in ("m30k", "ape", "ted"):
        train = tasks[name]["train"]
        for lang, column in zip((*train.source_langs, train.target_lang), (*train.sources, train.target)):
            columns.setdefault(lang, []).append(column)
    for lang, column in extra:
        columns.setdefault(lang, []).append(list(column))
    text = {}
    for lang, parts in columns.items():
        per_part = limit // len(parts) if limit else None
        text[lang] = list(dict.fromkeys(s for part in parts for s in part[:per_part] if s.strip()))
    return text


def extra_training_text(m30k_train_size: int) -> list[tuple[str, list[str]]]:
    """Training-side text beyond the tasks' training splits, which no chapter tests or validates on: Multi30k's
    Czech side (as many sentences as the De+Fr training set), MLQE-PE's training triplets (en source, de MT, de
    post-edit), and the News Commentary and Europarl document-level dev sets (de, en). TED's dev set is the TED
    task's training split already (minus the talks it validates on); no APE dev or test text, no test side."""
    czech = load_multi30k("train", sources=("cs",), target="en").sources[0][:m30k_train_size]
    mlqe = load_mlqe_pe("train", skip_empty=True)
    text = [("cs", czech), ("en", mlqe.sources[0]), ("de", mlqe.sources[1]), ("de", mlqe.target)]
    for corpus in ("nc", "europarl"):
        dev = load_doc_level("dev", corpus, skip_empty=True)
        text += [("de", dev.sources[1]), ("en", dev.target)]
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


def prepare_tasks(scale: DenoiserScale, seed: int = 0, allow_synthetic: bool = False) -> Tasks:
    """Load every task, train the joint tokenizer on the stage-0 text, and encode every split.

    `allow_synthetic`: fall back to the toy tasks when the real data cannot be had (smoke runs)."""
    corpora, synthetic = load_task_corpora(scale, seed, allow_synthetic)
    extra = [] if synthetic else extra_training_text(len(corpora["m30k"]["train"]))
    mono = monolingual_text(corpora, scale.pretrain_sentences, extra)
    texts = [s for sentences in mono.values() for s in sentences]
    tokenizer = Tokenizer.train(texts, vocab_size=scale.vocab_size, langs=tuple(mono), symbols=(SEP_PIECE,),
                                seed=seed)
    tasks = {}
    for name, splits in corpora.items():
        encoded = {s: encode_task(c, tokenizer, max_len=128 if s == "train" else None) for s, c in splits.items()}
        tasks[name] = TranslationData(tokenizer, splits, encoded, synthetic=synthetic)
    return Tasks(tokenizer, tasks, mono, synthetic)


# ---- the denoising run ------------------------------------------------------------------------------

def model_config(tokenizer: Tokenizer, scale: DenoiserScale, **trice_fields) -> TriceConfig:
    """The scale's preset on the joint vocabulary, as a TRICE configuration (`trice_fields` override it)."""
    base = preset(scale.preset, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **scale.model)
    return TriceConfig(**{**base.to_dict(), **trice_fields})


def derived_config(model: TriceTransformer, **trice_fields) -> TriceConfig:
    """The configuration of a model built on `model`: its Transformer fields (dimensions, vocabulary, dropout), TRICE's
    own fields at their defaults, then `trice_fields`. Every system fine-tuned from the denoiser, or trained from
    scratch at its size, is configured this way."""
    base = {name: value for name, value in model.cfg.to_dict().items() if name in TransformerConfig.__dataclass_fields__}
    return TriceConfig(**{**base, **trice_fields})


def copy_model(model: TriceTransformer) -> TriceTransformer:
    """A fresh model with the same weights (the pre-trained model stays untouched)."""
    clone = type(model)(model.cfg)
    clone.load_state_dict(model.state_dict())
    return clone


def split_heldout(texts: dict[str, list[str]], n: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(pre-training text, held-out clean text): the last `n` sentences of each language are held out, at most half
    of them (a short text, such as a dry run's capped one, keeps sentences to pre-train on)."""
    cut = {lang: min(n, len(s) // 2) for lang, s in texts.items()}
    return ({lang: s[:len(s) - cut[lang]] for lang, s in texts.items()},
            {lang: s[len(s) - cut[lang]:] for lang, s in texts.items()})


def noised_text_data(train_text: dict[str, list[str]], heldout: dict[str, list[str]], tokenizer: Tokenizer,
                     scale: DenoiserScale, first_seed: int, dev_seed: int, name: str,
                     synthetic: bool = False) -> TranslationData:
    """Denoising data (mBART's objective, msgcore.noising): noised -> clean on `train_text`, each sentence noised
    `scale.noise_draws` times (draw k with seed `first_seed + k`); its dev set is noised -> clean on `heldout`, one
    fixed draw (`dev_seed`, never a training one), scored against the clean sentences (a corpus named `name`)."""
    draws = [denoising_corpus(train_text, tokenizer, seed=first_seed + draw, copy_ratio=scale.pretrain_copy_ratio)
             for draw in range(scale.noise_draws)]
    train = EncodedCorpus([[ids for d in draws for ids in d.sources[0]]], [ids for d in draws for ids in d.target],
                          tokenizer.bos_id, tokenizer.eos_id)
    refs = [s for sentences in heldout.values() for s, ids in zip(sentences, tokenizer.encode_batch(sentences))
            if ids]  # the sentences denoising_corpus keeps, in its order
    val = Corpus(name, "val", ("any",), "any", [refs], refs)
    noised = denoising_corpus(heldout, tokenizer, seed=dev_seed)
    return TranslationData(tokenizer, {"val": val}, {"train": train, "val": noised}, synthetic=synthetic)


def denoising_data(tasks: Tasks, scale: DenoiserScale, seed: int = 0) -> TranslationData:
    """Stage 0's data: noised -> clean on the monolingual text; its dev set is held-out sentences, so that dev BLEU
    is the reconstruction BLEU that picks the best checkpoint and levels off when denoising has converged. Clean
    held-out text is the gate's (`reconstruction_bleu`)."""
    train_text, heldout = split_heldout(tasks.monolingual, scale.heldout_sentences)
    return noised_text_data(train_text, heldout, tasks.tokenizer, scale, first_seed=seed * scale.noise_draws,
                            dev_seed=-1 - seed, name="monolingual", synthetic=tasks.synthetic)


def pretrain(tasks: Tasks, scale: DenoiserScale, device: torch.device, out_dir: Path, seed: int = 0) -> RunResult:
    """Stage 0: mBART-style denoising (msgcore.noising) with a TRICE model of one source and no fine encoder,
    so that every later stage loads it whole (embedding LayerNorm included). Goes through the run cache."""
    data = denoising_data(tasks, scale, seed)
    torch.manual_seed(seed)
    model = TriceTransformer(model_config(tasks.tokenizer, scale, fine_layers=0))
    return train_model(model, data, replace(scale.pretrain, seed=seed), device, out_dir)


@dataclass
class Denoiser:
    """The pre-trained stand-in for mBART and everything needed to fine-tune it (chapters 1, 3 and 4)."""

    model: TriceTransformer  # single-source, no fine encoder; copy it before finetuning (`copy_model`)
    tokenizer: Tokenizer  # the joint tokenizer of every task and language (with language tags and <sep>)
    tasks: Tasks  # the encoded tasks (Multi30k De+Fr->En, APE, TED) and the pre-training text
    run: RunResult  # the pre-training run (its history; `reused` when it came from the run cache)
    scale: DenoiserScale


def pretrained_denoiser(scale_name: str, device: torch.device, seed: int = 0, out_dir: str | Path = "runs/denoiser",
                        tasks: Tasks | None = None) -> Denoiser:
    """The denoising pre-trained model at a scale, trained once and then reused from the run cache (every chapter
    asks for the same scale and seed and gets the same cached model)."""
    scale = get_scale(DENOISER_SCALES, scale_name)
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
