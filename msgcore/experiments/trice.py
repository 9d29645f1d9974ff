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

from msgcore.batching import encode_corpus
from msgcore.data import Corpus, load_ape, load_doc_level, load_multi30k, synthetic_corpus
from msgcore.experiments import RunResult, TranslationData, train_model
from msgcore.generation import GenerationConfig
from msgcore.metrics import corpus_score
from msgcore.model import Transformer, TransformerConfig, preset
from msgcore.models.trice import TriceConfig, TriceTransformer, from_single_source, sample_single_source
from msgcore.noising import denoising_corpus
from msgcore.tokenizer import SEP_PIECE, Tokenizer
from msgcore.trainer import Trainer, TrainConfig, translate_encoded
from msgcore.utils import DataError, MsgcoreError


@dataclass
class TriceScale:
    preset: str  # model preset for every system (msgcore.model.PRESETS)
    model: dict  # preset overrides, e.g. dropout
    pretrain: TrainConfig  # stage 0: denoising
    finetune: TrainConfig  # one finetuning run: a baseline, MBART-TRANS, DualBART
    stage1: TrainConfig  # TRICE stage 1 (single-source finetuning)
    stage2: TrainConfig  # TRICE stage 2 (and every stage-2 variant of Tables 5-7)
    vocab_size: int = 8000  # the joint sentencepiece vocabulary of all tasks and languages
    pretrain_sentences: int = 0  # monolingual sentences per language side for stage 0 (0 = all)
    train_examples: int = 0  # first N training examples of each task (0 = all)
    eval_examples: int = 0  # first N sentences of each dev/test set (0 = all)
    analysis_examples: int = 0  # first N APE dev triplets scored in the analyses, Tables 5-7 (0 = all)
    ted_test_documents: int = 0  # first N documents of the TED test set (0 = all 23)
    beam_size: int = 5  # test-time beam (1 = greedy)
    seeds: tuple[int, ...] = (0,)  # seeds of the main comparison (Table 3: DualBART vs TRICE)
    notes: str = ""  # what a reader should know about this scale


def _ft(steps: int, **kw) -> TrainConfig:
    """A finetuning config of `steps` updates that validates at its end (full scale: every 500 updates)."""
    base = dict(lr=1e-3, warmup_steps=max(steps // 10, 1), max_tokens=1536, max_epochs=1000, max_steps=steps,
                validate_every=steps, patience=0, valid_max_sentences=200, log_every=max(steps // 10, 1),
                progress=False)
    return TrainConfig(**{**base, **kw})


TRICE_SCALES: dict[str, TriceScale] = {
    "smoke": TriceScale(
        "tiny", dict(d_model=64, d_ff=128, n_heads=2, dropout=0.1),
        pretrain=_ft(30, validate_every=0, max_tokens=1024), finetune=_ft(12, max_tokens=1024, valid_max_sentences=20),
        stage1=_ft(6, max_tokens=1024, valid_max_sentences=20), stage2=_ft(6, max_tokens=1024, valid_max_sentences=20),
        vocab_size=1500, pretrain_sentences=2000, train_examples=1000, eval_examples=30, beam_size=1,
        analysis_examples=20, ted_test_documents=2,
        notes="CI only: checks that the chapter runs end to end; its numbers mean nothing."),
    "small": TriceScale(
        "tiny", dict(dropout=0.1),
        pretrain=_ft(800, validate_every=0, max_tokens=2048, lr=1.5e-3), finetune=_ft(160),
        stage1=_ft(80), stage2=_ft(80),
        vocab_size=6000, pretrain_sentences=12000, train_examples=0, eval_examples=0, beam_size=1,
        seeds=(0, 1, 2),
        notes="2 CPU cores, about 20 minutes for 32 training runs: 800 pre-training updates, each "
              "finetuning run 160 updates (TRICE: 80 + 80, compute-matched), greedy decoding. "
              "Nothing converges at this scale."),
    "full": TriceScale(
        "small", dict(dropout=0.1),
        pretrain=_ft(20000, validate_every=0, max_tokens=8192, lr=7e-4, warmup_steps=2000),
        finetune=_ft(4000, max_tokens=4096, lr=3e-4, valid_max_sentences=0, validate_every=500, patience=4),
        stage1=_ft(4000, max_tokens=4096, lr=3e-4, valid_max_sentences=0, validate_every=500, patience=4),
        stage2=_ft(4000, max_tokens=4096, lr=3e-4, valid_max_sentences=0, validate_every=500, patience=4),
        vocab_size=8000, beam_size=5, seeds=(0, 1, 2),
        notes="One GPU: every stage trains to early stopping on dev BLEU, as in the paper."),
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
        encoded = {s: encode_corpus(c, tokenizer, max_len=128 if s == "train" else None) for s, c in splits.items()}
        tasks[name] = TranslationData(tokenizer, splits, encoded, synthetic=synthetic)
    return TriceTasks(tokenizer, tasks, mono, synthetic)


# ---- stages and systems ---------------------------------------------------------------------------

def base_config(data: TranslationData, scale: TriceScale) -> TransformerConfig:
    return preset(scale.preset, vocab_size=data.tokenizer.vocab_size, pad_id=data.tokenizer.pad_id, **scale.model)


def model_config(data: TranslationData, scale: TriceScale, **trice_fields) -> TriceConfig:
    return TriceConfig(**{**base_config(data, scale).to_dict(), **trice_fields})


def copy_model(model: Transformer) -> Transformer:
    """A fresh single-source model with the same weights (the pre-trained model stays untouched)."""
    clone = Transformer(model.cfg)
    clone.load_state_dict(model.state_dict())
    return clone


def pretrain(data: TranslationData, scale: TriceScale, device: torch.device, out_dir: Path, seed: int = 0,
             texts: dict[str, list[str]] | None = None) -> tuple[Transformer, list[dict]]:
    """Stage 0: mBART-style denoising on monolingual text (default: every side of data's training split)."""
    if texts is None:
        train = data.corpora["train"]
        n = scale.pretrain_sentences or len(train)
        texts = {lang: column[:n] for lang, column in zip(train.source_langs, train.sources)}
        texts[train.target_lang] = train.target[:n]
    torch.manual_seed(seed)
    model = Transformer(base_config(data, scale))
    trainer = Trainer(model, data.tokenizer, denoising_corpus(texts, data.tokenizer, seed=seed), None, None,
                      replace(scale.pretrain, seed=seed), device, out_dir)
    history = trainer.train()
    return trainer.model.eval(), history


def single_source_data(data: TranslationData, split: str, seed: int):
    """Stage-1 data: one source per example, drawn with probability 1/K (segment embedding off)."""
    return encode_corpus(sample_single_source(data.corpora[split], seed=seed), data.tokenizer,
                         max_len=128 if split == "train" else None)


def train_stage1(pretrained: Transformer, data: TranslationData, scale: TriceScale, device: torch.device,
                 out_dir: Path, seed: int = 0, single: TranslationData | None = None) -> RunResult:
    """Stage 1 (§2.2): the pre-trained model finetuned on single-source examples: one source drawn
    per example (probability 1/K), or the given single-source task `single`."""
    if single is not None:
        return train_model(copy_model(pretrained), single, replace(scale.stage1, seed=seed), device, out_dir)
    return train_model(copy_model(pretrained), data, replace(scale.stage1, seed=seed), device, out_dir,
                       train=single_source_data(data, "train", seed), valid=single_source_data(data, "val", seed))


def train_stage2(stage1: Transformer, data: TranslationData, scale: TriceScale, device: torch.device,
                 out_dir: Path, seed: int = 0, train_cfg: TrainConfig | None = None, freeze_old: bool = False,
                 **trice_fields) -> RunResult:
    """Stage 2 (§2.2): a TRICE model (fine encoder new and random) from the stage-1 weights.

    `freeze_old` trains only the new parameters (Table 7, "fine encoder only")."""
    torch.manual_seed(seed)
    model = from_single_source(stage1, model_config(data, scale, **trice_fields))
    if freeze_old:
        new = set(model.new_parameter_names())
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name in new)
    return train_model(model, data, replace(train_cfg or scale.stage2, seed=seed), device, out_dir)


def train_trice(pretrained: Transformer, data: TranslationData, scale: TriceScale, device: torch.device,
                out_dir: Path, seed: int = 0, single: TranslationData | None = None,
                **trice_fields) -> tuple[RunResult, RunResult]:
    """Stage 1 then stage 2; returns both runs (stage 2's model is TRICE).

    # Deviation: for document-level translation stage 1 trains on the current sentence only
    # (`single`): drawing the previous sentence as the only source of the current sentence's
    # translation would teach the model to hallucinate.
    """
    stage1 = train_stage1(pretrained, data, scale, device, out_dir / "stage1", seed, single)
    return stage1, train_stage2(stage1.model, data, scale, device, out_dir / "stage2", seed, **trice_fields)


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


def compute_matched(scale: TriceScale) -> TrainConfig:
    """Stage-2 settings with as many updates as stages 1 and 2 together (Table 6, "- gradual finetuning")."""
    steps = scale.stage1.max_steps + scale.stage2.max_steps
    every = scale.stage2.validate_every if scale.stage2.validate_every < scale.stage2.max_steps else steps
    return replace(scale.stage2, max_steps=steps, validate_every=every, log_every=max(steps // 10, 1))


# ---- evaluation ---------------------------------------------------------------------------------

def translate(model, data: TranslationData, split: str, scale: TriceScale, device: torch.device,
              sources: list[list[str]] | None = None) -> list[str]:
    """Decode a split (or the same split with `sources` replaced, for Table 8)."""
    encoded = data.encoded[split]
    if sources is not None:
        corpus = replace(data.corpora[split], sources=sources)
        encoded = encode_corpus(corpus, data.tokenizer)
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
