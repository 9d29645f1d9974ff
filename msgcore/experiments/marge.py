"""MARGE recipes (Lewis et al. 2020): comparable documents, retrieval metrics, a pre-training loop, the chapter.

The data analogue: the paper pre-trains on documents that are related but not translations of each other (news and
Wikipedia articles about the same event or entity, in many languages). Multi30k task 2 is that setting in miniature:
5 English and 5 German descriptions of each image, each written by someone who saw only the image. Every description
is a document, an image's documents are one group (its related documents), and task 1's French or Czech caption of
the image joins the group with the English description it translates left out (`comparable_documents`). No document
translates another, so the corpus holds no bitext. Task 1's aligned captions are kept for the analyses where aligned
data is the point: retrieving translations (Table 3), and the test references of zero-shot translation (Table 2).
`toy_documents` does the same with the seeded synthetic corpus and a word-level vocabulary, for tests.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from msgcore import dryrun, verdicts as V
from msgcore.batching import EncodedCorpus
from msgcore.data import Corpus, load_doc_level, load_multi30k, load_multi30k_task2, synthetic_corpus
from msgcore.foundations.denoiser import (Denoiser, copy_model, derived_config, noised_text_data,
                                          pretrained_denoiser)
from msgcore.metrics import corpus_score, paired_standard_error, sentence_statistics, statistics_scorer
from msgcore.recipes import CPU_BOOK_SETTING, TranslationData, train_model
from msgcore.retrieval import BatchConstructor, RetrievalConfig, embed_documents, link_precision
from msgcore.trainer import Trainer, TrainConfig, numerics
from msgcore.utils import CheckpointError, MsgcoreError, keep_freed_memory

PAD, BOS, EOS = 0, 1, 2  # the ids `toy_documents` reserves (the core tokenizer uses 0, 2, 3 for pad, bos, eos)


@dataclass
class Documents:
    """A corpus of documents for MARGE pre-training."""

    pieces: list[list[int]]  # token ids of each document (no bos/eos)
    langs: list[str]  # language of each document
    groups: list[int]  # related documents share a group (the same image / sentence)
    prefixes: list[int]  # decoder's first input when the document is a target: its language tag id
    vocab: dict[str, int] = field(default_factory=dict)  # word-level vocabulary (toy documents only)

    def __len__(self) -> int:
        return len(self.pieces)

    def subset(self, indices) -> "Documents":
        indices = list(indices)
        return Documents([self.pieces[i] for i in indices], [self.langs[i] for i in indices],
                         [self.groups[i] for i in indices], [self.prefixes[i] for i in indices], self.vocab)


def columns_of(corpus: Corpus) -> list[tuple[str, list[str]]]:
    """(language, sentences) for every column of an aligned corpus, sources then target."""
    return [*zip(corpus.source_langs, corpus.sources), (corpus.target_lang, corpus.target)]


TASK1_SPLIT = {"train": "train", "val": "val", "test_2016": "test_2016_flickr"}  # task 2's split -> task 1's
EXTRA_LANGUAGES = ("fr", "cs")  # task 1's other caption languages: an image gives one of them, in turn


def comparable_texts(split: str = "train", images: range | None = None, extra: tuple[str, ...] = EXTRA_LANGUAGES,
                     task2_dir=None, task1_dir=None) -> dict[str, list[tuple[int, str]]]:
    """Multi30k as comparable documents with no translation among them: related documents and no bitext, the
    setting of §1 (the paper's "equivalent article in another language" is not a translation either). Returns
    language -> (image row, text) of every document.

    Each image of `images` (default: the whole split) gives:
    - its task-2 descriptions: 5 English and 5 German, each written by someone who saw only the image;
    - one task-1 caption in a language of `extra`, the images taking them in turn (image i: extra[i % len(extra)]).
    Task 1's captions are translations of one of the image's English descriptions, so that description is left out,
    as is a German description identical to task 1's German caption: no document of an image translates another,
    and two captions of task 1 (translations of each other) never describe the same image here."""
    descriptions = load_multi30k_task2(split, ("en", "de"), data_dir=task2_dir)
    rows = range(len(descriptions)) if images is None else images
    if rows and (rows[0] < 0 or rows[-1] >= len(descriptions)):
        raise MsgcoreError(f"images {rows.start}..{rows.stop - 1} are outside task 2's {split} split "
                           f"({len(descriptions):,} images)")
    task1 = dict(columns_of(load_multi30k(TASK1_SPLIT[split], sources=("de", *extra), target="en",
                                          data_dir=task1_dir)))
    texts: dict[str, list[tuple[int, str]]] = {lang: [] for lang in ("en", "de", *extra)}
    for i in rows:
        for lang in ("en", "de"):
            texts[lang] += [(i, text) for text in descriptions.descriptions[lang][i] if text != task1[lang][i]]
        if extra:
            lang = extra[i % len(extra)]
            texts[lang].append((i, task1[lang][i]))
    return texts


def documents_of(tokenizer, texts: dict[str, list[tuple[int, str]]], max_len: int = 128) -> Documents:
    """MARGE's documents from `comparable_texts`: an image's documents form its group, numbered by its row."""
    pieces, langs, groups = [], [], []
    for lang, rows in texts.items():
        pieces += [ids[:max_len] for ids in tokenizer.encode_batch([text for _, text in rows])]
        langs += [lang] * len(rows)
        groups += [i for i, _ in rows]
    return Documents(pieces, langs, groups, [tokenizer.lang_id(lang) for lang in langs])


def toy_documents(n: int, num_languages: int = 2, seed: int = 0, vocab_size: int = 12) -> Documents:
    """The synthetic corpus (msgcore.data.synthetic_corpus) as documents with a word-level vocabulary.

    num_languages - 1 source languages plus the target language "xt"; ids 0, 1, 2 are pad, bos, eos.
    """
    corpus = synthetic_corpus(n, num_sources=num_languages - 1, seed=seed, vocab_size=vocab_size,
                              min_len=3, max_len=6)
    columns = columns_of(corpus)
    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, **{f"<2{lang}>": 3 + i for i, (lang, _) in enumerate(columns)}}
    pieces, langs, groups = [], [], []
    for row in range(n):
        for lang, column in columns:
            pieces.append([vocab.setdefault(word, len(vocab)) for word in column[row].split()])
            langs.append(lang)
            groups.append(row)
    return Documents(pieces, langs, groups, [vocab[f"<2{lang}>"] for lang in langs], vocab)


@torch.no_grad()
def retrieval_metrics(model, docs: Documents, bos_id: int = BOS, eos_id: int = EOS, pad_id: int = PAD,
                      pool_groups: int = 0) -> dict:
    """Cross-lingual retrieval with g: for each document, the documents of other languages ranked by f, over the
    whole corpus or, with `pool_groups`, within its pool (the documents of `pool_groups` consecutive groups, in
    the order of their numbers: a shard's worth), so that the task's difficulty does not grow with the corpus. P@1
    and MRR of the nearest related document; hits = each query's P@1 (1: its nearest other-language document is
    related; the queries are the documents that have one, in corpus order), which the bootstrap over queries
    resamples (`rate_statistics`); gap = mean f of related minus mean f of unrelated cross-lingual pairs; spread =
    std of f over the cross-lingual pairs (a collapse warning when ~0)."""
    g = embed_documents(model, docs.pieces, bos_id, eos_id, pad_id)  # (D, d), unit rows
    codes = {lang: i for i, lang in enumerate(sorted(set(docs.langs)))}
    lang = torch.tensor([codes[x] for x in docs.langs])
    group = torch.tensor(docs.groups)
    rank_of = {gr: i for i, gr in enumerate(sorted(set(docs.groups)))}
    pool = torch.tensor([rank_of[gr] // pool_groups if pool_groups else 0 for gr in docs.groups])
    parts = [pool_retrieval(g[idx], lang[idx], group[idx]) | {"index": idx}
             for idx in (torch.nonzero(pool == p).squeeze(1) for p in pool.unique())]
    order = torch.cat([part["index"][part["has"]] for part in parts]).argsort()
    hits = torch.cat([part["hits"] for part in parts])[order]
    reciprocal = torch.cat([part["reciprocal"] for part in parts])
    total = {key: sum(part[key] for part in parts) for key in ("related", "n_related", "other", "n_other", "squares")}
    n_cross = total["n_related"] + total["n_other"]
    mean = (total["related"] + total["other"]) / n_cross
    return {"p_at_1": hits.float().mean().item(), "hits": hits.int().tolist(), "mrr": reciprocal.mean().item(),
            "gap": total["related"] / max(total["n_related"], 1) - total["other"] / max(total["n_other"], 1),
            "spread": math.sqrt(max(total["squares"] - n_cross * mean ** 2, 0.0) / max(n_cross - 1, 1))}


def retrieval_by_pooling(model, docs: Documents, bos_id: int = BOS, eos_id: int = EOS, pad_id: int = PAD,
                         pool_groups: int = 0) -> dict[str, dict]:
    """`retrieval_metrics` of `model` with g taken both ways: "bos", the state at the first token (the paper's §3),
    and "mean", the mean over the document's tokens (our scales'). The model's own choice is restored afterwards.
    On a fresh encoder this is what the scales' `relevance_pooling` rests on: how far apart the cosines f lie
    ("spread") when nothing has been trained."""
    encoder = model.encoder
    kept = encoder.relevance_pooling
    try:
        out = {}
        for how in ("bos", "mean"):
            encoder.relevance_pooling = how
            out[how] = retrieval_metrics(model, docs, bos_id, eos_id, pad_id, pool_groups=pool_groups)
        return out
    finally:
        encoder.relevance_pooling = kept


def pool_retrieval(g: torch.Tensor, lang: torch.Tensor, group: torch.Tensor) -> dict:
    """`retrieval_metrics` within one pool of documents: per query with a related document in another language, its
    hit and the reciprocal rank of its best related document; sums of f over related and unrelated cross-lingual
    pairs, and of f squared over both (for the spread)."""
    f = (g @ g.T).float()  # (D, D) cosines, Eq. (1)
    cross = lang[:, None] != lang[None, :]
    related = cross & (group[:, None] == group[None, :])
    has = related.any(1)
    scores = f.masked_fill(~cross, float("-inf"))
    best_related = f.masked_fill(~related, float("-inf")).amax(1, keepdim=True)
    rank = (scores > best_related).sum(1).float() + 1  # rank of the best related document
    other = cross & ~related
    return {"has": has, "hits": (group[scores.argmax(1)] == group)[has], "reciprocal": (1 / rank)[has],
            "related": f[related].sum().item(), "n_related": int(related.sum()),
            "other": f[other].sum().item(), "n_other": int(other.sum()), "squares": f[cross].square().sum().item()}


def pretrain(model, constructor: BatchConstructor, steps: int, lr: float = 1e-3, label_smoothing: float = 0.0,
             on_refresh=None, warmup: int = 0, decay: bool = False, clip_norm: float = 0.0,
             device: torch.device | str = "cpu", last: Path | None = None, amp: str = "fp32",
             sdpa_backends: tuple[str, ...] = (), on_end=None) -> list[dict]:
    """A plain MARGE pre-training loop (Adam, loss per target token).

    Learning rate: linear warmup over `warmup` updates, then constant, or with `decay` linearly to 0 at
    `steps` (§3: "linearly annealed ... to 0 with 10k warmup"). Returns one log row per refresh, logged when a batch
    opens a new index period and before its update: the update count so far (`step`), the budget trained on so far
    (`source_tokens`: the real tokens of every document of the batches, `target_tokens`: those of their targets),
    the mean loss of the period before, and what `on_refresh(model, constructor)` returns. `on_end(model)`, when
    given, adds a last row (marked "final") after the last update, with what it returns (the trained model's dev
    scores). `last`: at the end of every index period the loop writes everything it needs there
    (`save_pretraining`), and a call that finds that file resumes from it; on one device the result equals an
    uninterrupted run's. `amp` and `sdpa_backends` are the core Trainer's numerics (`msgcore.trainer.numerics`);
    fp16 is refused (it would need a gradient scaler, which this loop does not keep).
    """
    device, steps = torch.device(device), dryrun.updates(steps)  # a dry run's caps, if any
    amp_dtype, backends = Trainer.resolve_amp(amp, device), Trainer.resolve_sdpa_backends(sdpa_backends, device)
    if device.type == "cpu":
        keep_freed_memory()  # as the core Trainer does
    if amp_dtype == torch.float16:
        raise MsgcoreError("MARGE's pre-training loop runs in fp32 or bf16, not fp16 (it keeps no gradient scaler)")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)

    def factor(step: int) -> float:
        rise = min(1.0, (step + 1) / warmup) if warmup else 1.0
        return rise * (max(0.0, 1 - step / steps) if decay and step >= warmup else 1.0)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    progress = {"step": 0, "log": [], "losses": [], "seconds": 0.0, "source_tokens": 0, "target_tokens": 0}
    if last is not None and Path(last).is_file():
        progress = resume_pretraining(last, model, optimizer, scheduler, constructor)
    log, losses, start = progress["log"], progress["losses"], time.time() - progress["seconds"]
    budget = {"source_tokens": progress["source_tokens"], "target_tokens": progress["target_tokens"]}

    def row(step: int) -> dict:
        return {"step": step, **budget, "loss": sum(losses) / len(losses) if losses else float("nan"),
                "seconds": time.time() - start}

    for step in range(progress["step"], steps):
        model.train()
        batch = constructor.next_batch(model)
        if constructor.updates_since_refresh == 1:  # this batch opened a new index period
            log.append({"refresh": constructor.refreshes, "links": len(constructor.links),
                        "batches": len(constructor.batches), "betas": model.betas(),
                        "link_precision": link_precision(constructor.links, constructor.groups, constructor.langs),
                        **row(step), **(on_refresh(model, constructor) if on_refresh else {})})
            losses.clear()
        budget["source_tokens"] += int(batch.doc_mask.sum())
        budget["target_tokens"] += batch.num_target_tokens
        batch = batch.to(device)
        with numerics(device, amp_dtype, backends):  # the backward pass runs on the forward's kernels
            loss = model.loss(batch, label_smoothing) / batch.num_target_tokens
            optimizer.zero_grad()
            loss.backward()
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if last is not None and constructor.updates_since_refresh >= constructor.cfg.refresh_every:
            save_pretraining(last, model, optimizer, scheduler, constructor,
                             {**row(step + 1), "log": log, "losses": losses})
    if on_end is not None:
        log.append({"refresh": constructor.refreshes + 1, "final": True, **row(steps), **on_end(model)})
    return log


def save_pretraining(path: Path, model, optimizer, scheduler, constructor: BatchConstructor, progress: dict) -> None:
    """Write a resumable pre-training state atomically: weights, optimizer, schedule, batch construction
    (shards, this period's batches and position, its RNG), the RNG states and the log so far."""
    from msgcore.trainer import rng_state, weights_sha256, write_checkpoint

    weights = model.state_dict()
    write_checkpoint({"model": weights, "weights_sha256": weights_sha256(weights), "model_class": type(model).__name__,
                      "model_config": model.cfg.to_dict(), "optimizer": optimizer.state_dict(),
                      "scheduler": scheduler.state_dict(), "rng": rng_state(), "state": progress,
                      "train_config": {"retrieval": asdict(constructor.cfg)}, "constructor": constructor.state_dict()},
                     Path(path))


def resume_pretraining(path: Path, model, optimizer, scheduler, constructor: BatchConstructor) -> dict:
    """Restore what `save_pretraining` wrote into the given objects; returns the loop's progress."""
    from msgcore.trainer import load_checkpoint, set_rng_state

    checkpoint = load_checkpoint(path)
    if checkpoint.get("model_class") != type(model).__name__ or "constructor" not in checkpoint:
        raise CheckpointError(f"{path} is not a {type(model).__name__} pre-training checkpoint")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    constructor.load_state_dict(checkpoint["constructor"])
    set_rng_state(checkpoint["rng"])
    print(f"resuming MARGE pre-training from {Path(path).parent.name}/{Path(path).name} at update "
          f"{checkpoint['state']['step']:,}")  # the run's own name: a page shows no machine path
    return checkpoint["state"]


# ---- the chapter: scales, runs, evaluations (Lewis et al. 2020, §3, §4) ---------------------------------

@dataclass
class MargeScale:
    """Everything a scale changes for chapter 3."""

    model: dict  # MargeConfig fields (relevance_layers, beta_init, ...); warm-started, the size is the denoiser's
    images: int  # Multi30k training images: each gives 10 comparable documents (`comparable_texts`)
    shard_images: int  # images per shard (an image's documents share a shard, §2.4); val P@1 ranks within as many
    retrieval: RetrievalConfig  # refresh interval R, link quotas, batch budget
    steps: int  # pre-training updates of the main run (and of the continued denoiser, the control)
    lr: float  # peak learning rate (linear warmup, then linear decay to 0, §3)
    warmup: int  # warmup updates
    finetune: TrainConfig  # Table 4 analogue: fine-tuning on TED De->En (every initialisation alike)
    ablation_steps: int  # pre-training updates of each ablation run (the main run is re-run at this length too)
    seeds: tuple[int, ...] = (0,)  # seeds of every trained system (offsets from the chapter's seed), paired by id
    val_images: int = 200  # Multi30k val images whose documents measure retrieval at every refresh
    control_val_images: int = 100  # val images whose documents, noised, are the continued denoiser's dev set
    eval_sentences: int = 1000  # test_2016_flickr captions per language for retrieval and zero-shot translation
    beam_size: int = 1  # zero-shot and fine-tuned decoding (paper: beam 6)
    label_smoothing: float = 0.1
    amp: str = "fp32"  # pre-training precision, as TrainConfig.amp ("bf16": autocast; the fine-tuning runs set theirs)
    sdpa_backends: tuple[str, ...] = ()  # pre-training's SDPA kernels on a CPU, as TrainConfig.sdpa_backends
    min_p_at_1: float = 0.1  # gate: MARGE's cross-lingual P@1 on val must reach this ...
    min_gain: float = 0.05  # ... and rise by this much over the run's own start (first refresh)
    min_finetune_margin: float = 1.0  # gate: BLEU a fine-tuned baseline must score above the best floor (copy,
    #                                   constant) of its test set: below it, fine-tuning has not learnt the task
    min_finetune_gain: float = 1.0  # gate: BLEU MARGE fine-tuned on TED must gain over its own zero-shot TED output
    from_denoiser: bool = True  # main runs start from the shared denoiser (msgcore.foundations.denoiser) (`warm_start`); False: random init (§2.1)
    table5_images: int = 0  # Table 5 protocol: X->en fine-tuning pairs per language (Multi30k's last N training images)
    table5_steps: int = 0  # Table 5 fine-tuning updates per training language of a run (0 = the protocol is not run)
    notes: str = ""


VALIDATIONS = 4  # validations of a fine-tuning run: the fewest that show a plateau (msgcore.verdicts.MIN_VALIDATIONS)


def _ft(steps: int, **kw) -> TrainConfig:
    """A fine-tuning recipe of `steps` updates, validated `VALIDATIONS` times on the whole dev set."""
    base = dict(lr=5e-4, warmup_steps=max(steps // 10, 1), max_tokens=1536, max_epochs=1000, max_steps=steps,
                validate_every=max(steps // VALIDATIONS, 1), patience=0, valid_max_sentences=0,
                log_every=max(steps // 10, 1), progress=False)
    return TrainConfig(**{**base, **kw})


# Deviation: β starts at 10 in every scale (`beta_init`), not at MargeConfig's default of 1.0 (lucidrains'; the paper
# gives no value): at our sizes the cosines f of a fresh encoder lie within a few hundredths of each other, so β = 1
# barely moves the cross-attention and g learns slowly (tests/test_marge.py measures it on the toy corpus).

SMALL_MODEL = dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3, relevance_layers=2,
                   decoder_self_only_layers=1, decoder_d_ff=1024, beta_init=10.0, relevance_pooling="mean",
                   dropout=0.1)  # the denoiser's `small` preset, relevance from layer 2, 1 self-only decoder layer

MARGE_SCALES: dict[str, MargeScale] = {
    "smoke": MargeScale(
        dict(d_model=64, n_heads=2, d_ff=128, encoder_layers=2, decoder_layers=2, relevance_layers=1,
             decoder_self_only_layers=1, decoder_d_ff=128, beta_init=10.0, relevance_pooling="mean"),
        images=24, shard_images=4, retrieval=RetrievalConfig(refresh_every=10, max_tokens=300, max_docs=8),
        steps=30, lr=1e-3, warmup=5, finetune=_ft(8, max_tokens=1024, valid_max_sentences=10), ablation_steps=20,
        seeds=(0, 1), val_images=12, control_val_images=4, eval_sentences=30, min_p_at_1=0.1, table5_images=60,
        table5_steps=4, notes="CI only: checks that the chapter runs end to end; its numbers mean nothing."),
    "small": MargeScale(
        SMALL_MODEL, images=1000, shard_images=32,
        retrieval=RetrievalConfig(refresh_every=150, max_tokens=300, max_docs=8),
        steps=2500, lr=1e-3, warmup=100, ablation_steps=1000,
        finetune=_ft(1500, max_tokens=1536, validate_every=150, patience=2, **CPU_BOOK_SETTING),
        seeds=(0, 1, 2), val_images=1014, control_val_images=100, eval_sentences=300, table5_images=4000,
        table5_steps=150, **CPU_BOOK_SETTING,
        notes="bf16 autocast (and on a CPU the math attention kernel): MARGE at the shared denoising model's size (the "
              "`small` preset: d=256, 3 encoder layers, relevance from layer 2, decoder 1 self-only + 2 "
              "cross-attention layers), warm-started from it, pre-trained for 2,500 updates on 3 seeds on the "
              "comparable descriptions of 1,000 Multi30k images (10,000 documents in 4 languages, no translations), "
              "shards of 32 images, index refreshed every 150 updates; the continued denoiser for as many updates "
              "and target tokens; ablations (random initialisation among them) at 1,000 updates; fine-tuning on TED "
              "with early stopping on its whole dev set (patience 2, at most 1,500 updates); Table 5's protocol "
              "with 150 fine-tuning updates per language; every system on 3 seeds; greedy decoding; 300 test "
              "captions per language."),
    "full": MargeScale(
        SMALL_MODEL, images=29000, shard_images=64,
        retrieval=RetrievalConfig(refresh_every=1000, max_tokens=1536, max_docs=32),
        steps=20000, lr=5e-4, warmup=1000, finetune=_ft(4000, max_tokens=4096, lr=3e-4, patience=4,
                                                         validate_every=500), ablation_steps=8000,
        seeds=(0, 1, 2), val_images=1014, control_val_images=300, eval_sentences=1000, beam_size=6,
        table5_images=10000, table5_steps=1000,
        notes="One GPU: MARGE at the shared denoising model's size (the `small` preset), warm-started from it, the "
              "comparable descriptions of every Multi30k training image (290k documents), index refreshed every "
              "1,000 updates; beam 6 as in the paper."),
}

# The ablations, each a change of the main recipe at `ablation_steps` updates, on every seed. The corpus holds no
# translation in any of them, so the main runs themselves test "no bitext" (§1).
ABLATIONS = {
    "MARGE": {},
    "β = 0 (no relevance bias)": {"beta": 0.0},
    "shards ×8": {"shard_factor": 8},
    "refresh ×4 rarer": {"refresh_factor": 4},
    "random initialisation (the paper's start)": {"init": "random"},
}


def get_marge_scale(name: str) -> MargeScale:
    if name not in MARGE_SCALES:
        raise MsgcoreError(f"unknown scale {name!r}; choose one of {', '.join(MARGE_SCALES)}")
    return MARGE_SCALES[name]


def ablation(name: str) -> dict:
    """The recipe change of an ablation (a bad name is a one-line MsgcoreError)."""
    if name not in ABLATIONS:
        raise MsgcoreError(f"unknown ablation {name!r}; choose one of {', '.join(ABLATIONS)}")
    return ABLATIONS[name]


# ---- cached pre-training ------------------------------------------------------------------------------

@dataclass
class MargeRun:
    model: torch.nn.Module  # the pre-trained MargeTransformer, eval mode
    log: list[dict]  # one row per index refresh (see `pretrain`)
    wall_time_s: float
    reused: bool = False


# What a MARGE and the model it warm-starts from share: one size, so that every tensor of MARGE but its own is copied.
DONOR_DIMENSIONS = ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers")
MARGE_OWN = (".beta",)  # tensors only MARGE has: β of each cross-attention layer (Eq. 4)


def marge_config(tokenizer, scale: MargeScale, like=None, **overrides):
    """MARGE's config at `scale`; with `like` (the donor's config), at the donor's dimensions (DONOR_DIMENSIONS, and
    the decoder's FFN width), whatever the scale says, so that a warm start copies the whole encoder and decoder."""
    from msgcore.models.marge import MargeConfig

    dims = {} if like is None else {**{k: getattr(like, k) for k in DONOR_DIMENSIONS}, "decoder_d_ff": like.d_ff}
    return MargeConfig(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **{**scale.model, **dims, **overrides})


def warm_start(model: torch.nn.Module, donor: torch.nn.Module) -> list[str]:
    """Copy into `model` every tensor of `donor` with the same name and shape; returns the names copied.

    Every tensor of `model` but MARGE's own (MARGE_OWN) must be copied: a warm start that would leave part of the
    embeddings, encoder or decoder at random initialisation is a one-line MsgcoreError, raised before anything is
    copied (build the model with `marge_config(..., like=donor.cfg)`).

    # Deviation: §2.1 trains MARGE from random initialisation. At our scale retrieval does not bootstrap from
    # random init (the ablation shows it), so the main runs start from the shared denoising model: its embeddings,
    # encoder layers (the first are MARGE's relevance model g) and decoder layers. It was trained on monolingual
    # text only (denoising), so no bitext enters."""
    own, theirs = model.state_dict(), donor.state_dict()
    copied = [name for name, t in own.items() if name in theirs and theirs[name].shape == t.shape]
    left = [name for name in own if name not in copied and not name.endswith(MARGE_OWN)]
    if left:
        first = left[0]
        why = (f"{tuple(own[first].shape)} here, {tuple(theirs[first].shape)} in the donor" if first in theirs
               else "the donor has no such tensor")
        raise MsgcoreError(f"a warm start would leave {len(left)} of the model's {len(own)} tensors at random "
                           f"initialisation (first: {first}: {why}); build MARGE at the donor's size "
                           "(marge_config(..., like=donor.cfg))")
    model.load_state_dict({**own, **{name: theirs[name].detach().clone() for name in copied}})
    return copied


def train_marge(docs: Documents, val_docs: Documents, tokenizer, scale: MargeScale, device: torch.device,
                steps: int, seed: int = 0, change: dict | None = None,
                donor: torch.nn.Module | None = None) -> MargeRun:
    """One MARGE pre-training run through the run cache (msgcore.runcache), keyed like `train_model`'s runs.
    `donor`: a model to warm-start from (`warm_start`), unless `change` asks for {"init": "random"}.

    # Deviation: pre-training has its own loop (`pretrain`), not the core Trainer: its batches come from the
    # index, not from an EncodedCorpus. Like `train_model`'s runs, a finished run is reused and an interrupted
    # one resumes from the `last.pt` of its cache entry (written at the end of every index period).
    """
    import inspect
    import json

    from msgcore import runcache
    from msgcore.models.marge import MargeTransformer
    from msgcore.retrieval import __file__ as retrieval_file

    change = dict(change or {})
    beta = change.get("beta")
    torch.manual_seed(seed)
    like = donor.cfg if donor is not None else None  # the random-init ablation too: one size for every run
    model = MargeTransformer(marge_config(tokenizer, scale, like,
                                          **({"beta_init": beta} if beta is not None else {})))
    if change.get("init", "donor") not in ("donor", "random"):
        raise MsgcoreError(f"unknown init {change['init']!r}; use 'donor' or 'random'")
    if donor is not None and change.get("init") != "random":
        warm_start(model, donor)  # the key below hashes the weights, so a warm start has runs of its own
    rcfg = replace(scale.retrieval, seed=seed, num_shards=max(1, len(set(docs.groups)) // (
        scale.shard_images * change.get("shard_factor", 1))),
        refresh_every=scale.retrieval.refresh_every * change.get("refresh_factor", 1))
    code = [runcache.code_fingerprint(MargeTransformer), Path(retrieval_file).read_text(), inspect.getsource(pretrain)]
    numerics_ = {"precision": str(Trainer.resolve_amp(scale.amp, torch.device(device))),
                 "sdpa": [str(b) for b in Trainer.resolve_sdpa_backends(scale.sdpa_backends, torch.device(device))]}
    key = runcache.fingerprint("marge-pretrain", model.cfg, model.state_dict(), rcfg, steps, scale.lr, scale.warmup,
                               scale.label_smoothing, beta, docs.pieces, docs.langs, docs.groups, docs.prefixes,
                               val_docs.pieces, val_docs.groups, scale.shard_images, code, numerics_)
    entry = runcache.entry_dir("run", key)
    meta = runcache.finished(entry) if entry else None
    if meta is not None:
        model.load_state_dict(torch.load(entry / "best.pt", map_location="cpu", weights_only=True))
        runcache.note_reused(entry.name)
        return MargeRun(model.to(device).eval(), json.loads((entry / "log.json").read_text()), meta["wall_time_s"], True)
    if beta is not None:
        for layer_beta in [p for n, p in model.named_parameters() if n.endswith(".beta")]:
            layer_beta.requires_grad_(False)  # the control: beta held at its value (0 = no bias, no gradient into g)
    model.to(device)
    stream = BatchConstructor(docs.pieces, docs.langs, docs.groups, docs.prefixes, rcfg, tokenizer.bos_id,
                              tokenizer.eos_id, tokenizer.pad_id)
    order = sorted(set(docs.langs))

    def dev_scores(m):
        return retrieval_metrics(m, val_docs, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id,
                                 pool_groups=scale.shard_images)

    def on_refresh(m, constructor):
        return {**dev_scores(m), "links_by_language": language_matrix(constructor.links, docs.langs, order)}

    start = time.perf_counter()
    if entry:
        runcache.begin(entry)
    log = pretrain(model, stream, steps, scale.lr, scale.label_smoothing, on_refresh, warmup=scale.warmup,
                   decay=True, clip_norm=1.0, device=device, last=entry / "last.pt" if entry else None,
                   amp=scale.amp, sdpa_backends=scale.sdpa_backends, on_end=dev_scores)
    wall = time.perf_counter() - start
    if entry:
        torch.save(model.state_dict(), entry / "best.pt")
        (entry / "log.json").write_text(json.dumps(log))
        (entry / "last.pt").unlink(missing_ok=True)  # the optimizer state is not needed once finished
        runcache.mark_finished(entry, ["best.pt", "log.json"], wall_time_s=wall, device=str(device),
                               model_class="MargeTransformer")
    return MargeRun(model.eval(), log, wall)


# ---- retrieval analyses (Table 3, Figure 2) -----------------------------------------------------------

def language_matrix(links, langs: list[str], order) -> list[list[int]]:
    """Figure 2's counts: [row = target-document language][column = evidence language], from index links."""
    pos = {lang: i for i, lang in enumerate(order)}
    counts = [[0] * len(order) for _ in order]
    for t, e in zip(links.target.tolist(), links.evidence.tolist()):
        counts[pos[langs[t]]][pos[langs[e]]] += 1
    return counts


def neighbour_language_matrix(g: torch.Tensor, langs: list[str], order, k: int = 4) -> list[list[int]]:
    """The same counts without the paper's quotas: each document's k nearest other documents by f."""
    f = g @ g.T  # (D, D) cosines, Eq. (1)
    f.fill_diagonal_(float("-inf"))
    nearest = f.topk(min(k, len(langs) - 1), dim=1).indices  # (D, k)
    pos = {lang: i for i, lang in enumerate(order)}
    counts = [[0] * len(order) for _ in order]
    for d, row in enumerate(nearest.tolist()):
        for e in row:
            counts[pos[langs[d]]][pos[langs[e]]] += 1
    return counts


def row_percent(counts: list[list[int]]) -> list[list[float]]:
    return [[100 * c / max(sum(row), 1) for c in row] for row in counts]


def hits_at_1(embeddings: dict[str, torch.Tensor]) -> dict[tuple[str, str], torch.Tensor]:
    """Tatoeba-style retrieval: per direction (a, b), whether sentence i of language a retrieves sentence i of
    language b among all of b's (a bool per sentence)."""
    return {(a, b): (ea @ eb.T).argmax(1) == torch.arange(ea.size(0))
            for a, ea in embeddings.items() for b, eb in embeddings.items() if a != b}


def precision_at_1(embeddings: dict[str, torch.Tensor]) -> dict[tuple[str, str], float]:
    """Tatoeba-style P@1 per direction (`hits_at_1`)."""
    return {pair: hits.float().mean().item() for pair, hits in hits_at_1(embeddings).items()}


@torch.no_grad()
def mean_pooled(model, rows: list[list[int]], pad_id: int, batch_size: int = 128) -> torch.Tensor:
    """Unit mean-pooled encoder outputs (N, D) of token rows: Table 3's representation (§4.1, averaged states).

    # Deviation: the encoder's last layer, not a layer tuned on BUCC dev (we have no BUCC)."""
    from msgcore.models.marge import pad as pad_rows

    model.eval()
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(rows), batch_size):
        tokens, mask = pad_rows(rows[start:start + batch_size], pad_id)
        hidden = model.encode([tokens.to(device)], [mask.to(device)])[0].hidden.float()  # (b, S, D)
        m = mask.to(device).unsqueeze(-1).float()
        out.append(torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1).cpu())
    return torch.cat(out)


def marge_rows(tokenizer, sentences: list[str]) -> list[list[int]]:
    """MARGE's document layout: <s> pieces </s>."""
    return [[tokenizer.bos_id, *ids, tokenizer.eos_id] for ids in tokenizer.encode_batch(list(sentences))]


def denoiser_rows(tokenizer, sentences: list[str], lang: str) -> list[list[int]]:
    """The denoiser's source layout (msgcore.noising): pieces </s> <lang>."""
    return [[*ids, tokenizer.eos_id, tokenizer.lang_id(lang)] for ids in tokenizer.encode_batch(list(sentences))]


def retrieval_table(systems: dict[str, tuple], texts: dict[str, list[str]], tokenizer) -> dict[str, dict]:
    """systems: name -> (model, "g" | "mean", "marge" | "denoiser" layout). Returns name -> {(a, b): the per-caption
    hits (`hits_at_1`) as a 0/1 array}: their mean is the direction's P@1, `rate_statistics` their bootstrap."""
    out = {}
    for name, (model, how, layout) in systems.items():
        emb = {}
        for lang, sentences in texts.items():
            rows = marge_rows(tokenizer, sentences) if layout == "marge" else denoiser_rows(tokenizer, sentences, lang)
            if how == "g":
                emb[lang] = embed_documents(model, [r[1:-1] for r in rows], tokenizer.bos_id, tokenizer.eos_id,
                                            tokenizer.pad_id)
            else:
                emb[lang] = mean_pooled(model, rows, tokenizer.pad_id)
        out[name] = {pair: hits.int().numpy() for pair, hits in hits_at_1(emb).items()}
    return out


def rate_statistics(hits) -> np.ndarray:
    """(N, 2): per query (a caption, a document) its hits and its trials, from 0/1 hits of shape (N,) or (N, d)
    (d directions of one caption); summed over any queries, `rate_score` turns them into the rate in %. The
    bootstrap over queries (`msgcore.metrics.replicates_from_statistics`) resamples their rows."""
    hits = np.asarray(hits, dtype=np.float64)
    hits = hits.reshape(len(hits), -1)
    return np.column_stack([hits.sum(1), np.full(len(hits), float(hits.shape[1]))])


def rate_score(totals) -> float:
    """A rate in % from summed `rate_statistics`."""
    return 100.0 * float(totals[0]) / float(totals[1])


def p1_statistics(hits: dict[tuple[str, str], np.ndarray]) -> np.ndarray:
    """The per-caption statistics of P@1 over every direction of a `retrieval_table` entry: caption i's hits in all
    directions are one row, so the bootstrap resamples captions (images), not directions."""
    return rate_statistics(np.stack([np.asarray(h) for h in hits.values()], axis=1))


# ---- zero-shot translation (Table 2) ------------------------------------------------------------------

def zero_shot_corpus(tokenizer, sources: list[str], references: list[str], target_lang: str):
    """Source as one evidence document, the decoder prompted with the target's language tag (§3, §4.2)."""
    from msgcore.batching import EncodedCorpus

    return EncodedCorpus([marge_rows(tokenizer, sources)], tokenizer.encode_batch(list(references)),
                         tokenizer.lang_id(target_lang), tokenizer.eos_id)


def doc_level_test(name: str, sentences: int) -> Corpus:
    """The first whole documents of a doc-level test set ("ted", "nc", "europarl"), `sentences` or a few more."""
    corpus = load_doc_level("test", name, skip_empty=True)
    keep, seen = [], set()
    for i, doc in enumerate(corpus.doc_ids):
        if doc not in seen and len(keep) >= sentences:
            break
        seen.add(doc)
        keep.append(i)
    return corpus.subset(keep)


def zero_shot(model, tokenizer, texts: dict[str, list[str]], source: str, target: str, device: torch.device,
              beam_size: int = 1) -> list[str]:
    """MARGE with no fine-tuning translates `source` -> `target` (one evidence document, so f is moot)."""
    from msgcore.generation import GenerationConfig
    from msgcore.trainer import translate_encoded

    encoded = zero_shot_corpus(tokenizer, texts[source], texts[target], target)
    return translate_encoded(model, tokenizer, encoded, device, GenerationConfig(beam_size=beam_size))


# ---- the chapter's runs --------------------------------------------------------------------------------

CONTROL = "denoising continued (control)"  # the denoiser trained on for MARGE's budget on MARGE's documents
DENOISER = "denoising (mBART stand-in)"  # the shared denoiser as it is (msgcore.foundations.denoiser)
FINETUNED_INITS = ("random init", CONTROL, "MARGE")  # Tables 4 and 5 fine-tune from these, on every seed


@dataclass
class MargeChapter:
    scale: MargeScale
    tokenizer: object  # the denoiser's joint tokenizer (en/de/fr/cs tags): one vocabulary for every system
    denoiser: Denoiser  # the shared pre-trained model (msgcore.foundations.denoiser, from the run cache)
    corpus: dict  # the pre-training documents' text: language -> (image, text) (`comparable_texts`)
    docs: Documents  # the pre-training corpus, encoded
    val_docs: Documents  # the val images' comparable documents: retrieval measured at every refresh
    texts: dict[str, list[str]]  # test_2016_flickr captions per language (first eval_sentences)
    device: torch.device
    seed: int
    runs: dict = field(default_factory=dict)  # (ablation name, seed, steps) -> MargeRun
    controls: dict = field(default_factory=dict)  # seed -> (RunResult, TrainConfig): the continued denoiser
    untrained: object = None  # a random-init MARGE (seed), never trained: the retrieval floor
    start: object = None  # the main runs' starting point, never trained: `untrained` warm-started from the denoiser
    warm_started: list = field(default_factory=list)  # the tensor names `warm_start` copied into `start`
    finetuned: dict = field(default_factory=dict)  # Table 4: (init name, seed) -> RunResult
    ted: dict = field(default_factory=dict)  # init name -> the TranslationData it trained on
    table5: list = field(default_factory=list)  # Table 5 protocol: (Table5Run, seed, RunResult, layout)
    supervised: tuple = ()  # chapter 0's de↔en Transformers and their data (`supervised_runs`)

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.seed + s for s in self.scale.seeds)

    def main(self, seed: int | None = None) -> MargeRun:
        return self.runs["MARGE", self.seed if seed is None else seed, self.scale.steps]

    def control(self, seed: int | None = None):
        return self.controls[self.seed if seed is None else seed][0]


def first_images(split: str, n: int) -> range:
    """The first n images of a task-2 split (all of them when it has fewer, as under a dry run's caps)."""
    return range(min(n, len(load_multi30k_task2(split, ("en",)))))


def test_texts(n: int) -> dict[str, list[str]]:
    corpus = load_multi30k("test_2016_flickr", sources=("de", "fr", "cs"), target="en")
    return {lang: list(column[:n]) for lang, column in columns_of(corpus)}


def start_chapter(scale_name: str, device: torch.device, out_dir, seed: int = 0) -> MargeChapter:
    scale = get_marge_scale(scale_name)
    denoiser = pretrained_denoiser(scale_name, device, seed, Path(out_dir) / "denoiser")
    tok = denoiser.tokenizer
    corpus = comparable_texts("train", first_images("train", scale.images))
    val_docs = documents_of(tok, comparable_texts("val", first_images("val", scale.val_images)))
    return MargeChapter(scale, tok, denoiser, corpus, documents_of(tok, corpus), val_docs,
                        test_texts(scale.eval_sentences), device, seed)


def prepare_starts(ch: MargeChapter) -> None:
    """The untrained MARGE of the chapter's seed (the retrieval floor) and the main runs' starting point: the same
    model warm-started from the denoiser, when the scale does so (`warm_start`, which says what it copied)."""
    from msgcore.models.marge import MargeTransformer

    donor = ch.denoiser.model if ch.scale.from_denoiser else None
    torch.manual_seed(ch.seed)
    ch.untrained = MargeTransformer(marge_config(ch.tokenizer, ch.scale, donor.cfg if donor else None))
    ch.untrained = ch.untrained.to(ch.device).eval()
    ch.start = MargeTransformer(ch.untrained.cfg).to(ch.device).eval()
    ch.start.load_state_dict(ch.untrained.state_dict())
    if donor is not None:
        ch.warm_started = warm_start(ch.start, donor)


def pretraining_runs(ch: MargeChapter, seed: int) -> None:
    """The main run of `seed`, then every ablation (the main recipe among them) at `ablation_steps`."""
    donor = ch.denoiser.model if ch.scale.from_denoiser else None
    ch.runs["MARGE", seed, ch.scale.steps] = train_marge(ch.docs, ch.val_docs, ch.tokenizer, ch.scale, ch.device,
                                                         ch.scale.steps, seed, donor=donor)
    for name, change in ABLATIONS.items():
        ch.runs[name, seed, ch.scale.ablation_steps] = train_marge(
            ch.docs, ch.val_docs, ch.tokenizer, ch.scale, ch.device, ch.scale.ablation_steps, seed, change, donor)


# ---- the control: the denoiser trained on, on MARGE's documents, for MARGE's budget ---------------------------

def control_data(ch: MargeChapter, seed: int) -> TranslationData:
    """Denoising, as the denoiser's own stage 0 (`noised_text_data`), on the text of MARGE's pre-training documents,
    with the seed's own draws; its dev set is the first `control_val_images` val images' documents."""
    scale = ch.denoiser.scale
    text = {lang: [t for _, t in rows] for lang, rows in ch.corpus.items()}
    heldout = {lang: [t for _, t in rows] for lang, rows in
               comparable_texts("val", first_images("val", ch.scale.control_val_images)).items()}
    return noised_text_data(text, heldout, ch.tokenizer, scale, first_seed=1000 + seed * scale.noise_draws,
                            dev_seed=-1 - seed, name="comparable documents")


def matched_max_tokens(train: EncodedCorpus, goal: float, seed: int) -> int:
    """The batch budget (TrainConfig.max_tokens) whose batches hold, on average over an epoch, the target tokens
    closest to `goal` (MARGE's target tokens per update): the smallest budget that reaches it, or the one below."""
    from msgcore.batching import example_lengths, token_batches

    lengths = example_lengths(train)
    targets = [len(t) + 1 for t in train.target]  # labels: the target and its end of sentence

    def mean_targets(max_tokens: int) -> float:
        batches = token_batches(lengths, max_tokens, shuffle=True, seed=seed)
        return sum(targets) / len(batches)

    low, high = 1, max(lengths) * max(1, math.ceil(goal))
    while low < high:  # the smallest budget whose batches reach the goal
        middle = (low + high) // 2
        low, high = (middle + 1, high) if mean_targets(middle) < goal else (low, middle)
    return min((low, max(low - 1, 1)), key=lambda m: abs(mean_targets(m) - goal))


def control_config(ch: MargeChapter, seed: int, max_tokens: int) -> TrainConfig:
    """The control's recipe: MARGE's updates, peak lr and warmup, in the core Trainer (inverse-sqrt decay), validated
    `VALIDATIONS` times on its whole dev set.

    # Deviation: MARGE's loop decays the learning rate linearly to 0 (§3); the control keeps the denoiser's own
    # schedule, as continuing its pre-training would."""
    every = max(ch.scale.steps // VALIDATIONS, 1)
    return TrainConfig(lr=ch.scale.lr, warmup_steps=ch.scale.warmup, max_tokens=max_tokens, max_epochs=10 ** 6,
                       max_steps=ch.scale.steps, validate_every=every, patience=0, valid_max_sentences=0,
                       log_every=max(every // 5, 1), progress=False, amp=ch.scale.amp,
                       sdpa_backends=ch.scale.sdpa_backends, seed=seed)


def control_run(ch: MargeChapter, seed: int, out_dir) -> None:
    """The continued denoiser of `seed`: as many updates as MARGE's main run of that seed and, through the batch
    budget (`matched_max_tokens`), as many target tokens. Its source tokens stay fewer: MARGE's encoder also reads
    the evidence documents."""
    data = control_data(ch, seed)
    goal = ch.main(seed).log[-1]["target_tokens"] / ch.scale.steps
    cfg = control_config(ch, seed, matched_max_tokens(data.encoded["train"], goal, seed))
    ch.controls[seed] = (train_model(copy_model(ch.denoiser.model), data, cfg, ch.device,
                                     Path(out_dir) / f"control-seed{seed}"), cfg)


# ---- fine-tuning (Table 4) ---------------------------------------------------------------------------------

def marge_translation_data(data, tokenizer):
    """A TranslationData in MARGE's layout (source <s> pieces </s>, decoder prompted with the target's tag)."""
    encoded = {split: zero_shot_corpus(tokenizer, c.sources[0], c.target, c.target_lang)
               for split, c in data.corpora.items()}
    encoded["train"].target = [t[:128] for t in encoded["train"].target]
    return TranslationData(tokenizer, data.corpora, encoded, synthetic=data.synthetic)


def initialisation(ch: MargeChapter, name: str, seed: int):
    """A fresh model for a fine-tuning run of `seed`: "random init" (seeded), a copy of the continued denoiser of
    that seed (the control), of the denoiser (the mBART stand-in) or of MARGE's main run of that seed. Tables 4 and
    5 start every run from one of these."""
    from msgcore.models.trice import TriceTransformer

    if name == "random init":
        torch.manual_seed(seed)
        return TriceTransformer(derived_config(ch.denoiser.model))
    models = {"MARGE": lambda: ch.main(seed).model, CONTROL: lambda: ch.control(seed).model,
              DENOISER: lambda: ch.denoiser.model}
    if name not in models:
        raise MsgcoreError(f"unknown initialisation {name!r}; choose one of random init, {', '.join(models)}")
    return copy_model(models[name]())


def ted_config(ch: MargeChapter, seed: int) -> TrainConfig:
    """The TED fine-tuning recipe, the same for every initialisation."""
    return replace(ch.scale.finetune, seed=seed)


def finetune_runs(ch: MargeChapter, seed: int, out_dir) -> None:
    """Table 4 analogue on `seed`: TED De->En from random init, the continued denoiser (the control) and MARGE,
    with the same fine-tuning recipe and number of fine-tuning updates (their whole budgets differ by the
    pre-training each starts from: `init_stages`)."""
    ted = ch.denoiser.tasks.tasks["ted_sent"]
    ch.ted = {"random init": ted, CONTROL: ted, "MARGE": marge_translation_data(ted, ch.tokenizer)}
    for i, name in enumerate(FINETUNED_INITS):
        ch.finetuned[name, seed] = train_model(initialisation(ch, name, seed), ch.ted[name], ted_config(ch, seed),
                                               ch.device, Path(out_dir) / f"ted-{i}-seed{seed}")


def seed_runs(ch: MargeChapter, seed: int, out_dir) -> None:
    """Every run of one seed, in the order they depend on each other: MARGE and its ablations, the control (matched
    to MARGE's budget), the TED fine-tuning runs and the Table 5 protocol's."""
    pretraining_runs(ch, seed)
    control_run(ch, seed, out_dir)
    finetune_runs(ch, seed, out_dir)
    if ch.scale.table5_steps:
        table5_runs(ch, seed, out_dir)


def run_chapter(scale_name: str, device: torch.device, out_dir, seed: int = 0,
                part: tuple[int, int] = (0, 1)) -> MargeChapter:
    """Every training run of chapter 3, through the run cache (`python -m msgcore.experiments ch03`). With `part` =
    (i, N), N processes side by side: process i trains every N-th seed's runs (`seed_runs`) and its share of chapter
    0's supervised seeds; process 0 then makes the full pass, finding the others' runs in the cache (or awaiting
    them: msgcore.runcache's lock), so that what it returns is the whole chapter."""
    ch = start_chapter(scale_name, device, out_dir, seed)
    prepare_starts(ch)
    if part != (0, 1):
        for s in ch.seeds[part[0]::part[1]]:
            seed_runs(ch, s, out_dir)
        supervised_runs(ch, scale_name, out_dir, part)
        if part[0] != 0:
            return ch
    for s in ch.seeds:
        seed_runs(ch, s, out_dir)
    ch.supervised = supervised_runs(ch, scale_name, out_dir)
    return ch


def ted_scores(ch: MargeChapter, beam_size: int | None = None) -> dict[tuple[str, int], dict]:
    """Table 4: s-BLEU and d-BLEU on the TED test set for each fine-tuned initialisation and seed, with the
    outputs."""
    from msgcore.generation import GenerationConfig
    from msgcore.metrics import corpus_score, document_bleu
    from msgcore.trainer import translate_encoded

    out = {}
    for (name, seed), run in ch.finetuned.items():
        data = ch.ted[name]
        corpus = data.corpora["test"]
        hyps = translate_encoded(run.model, ch.tokenizer, data.encoded["test"], ch.device,
                                 GenerationConfig(beam_size=beam_size or ch.scale.beam_size))
        out[name, seed] = {"hyps": hyps, "s-BLEU": corpus_score("bleu", hyps, corpus.target).score,
                           "d-BLEU": document_bleu(hyps, corpus.target, corpus.doc_ids)}
    return out


# ---- Table 5's protocol, with X->en translation as the task (notes, part B.4, T5) ------------------------
# MLSum is not available here. The protocol is kept: fine-tune on one language (Train One), on all (Train All),
# or on the other languages only with the embeddings and self-only decoder layers frozen (Zero-shot Transfer, §3).

TABLE5_LANGUAGES = ("de", "fr", "cs")


@dataclass
class Table5Run:
    init: str  # one of FINETUNED_INITS
    setting: str  # "Train One", "Train All" or "Zero-shot Transfer"
    train_languages: tuple[str, ...]  # the source languages of its fine-tuning pairs
    test_languages: tuple[str, ...]  # the source languages it is scored on


def table5_plan() -> list[Table5Run]:
    """MARGE in all three settings; the two other initialisations in Train All (the paper's baselines are
    "Train One" systems; one run each, per seed, keeps the page's budget)."""
    langs = TABLE5_LANGUAGES
    plan = [Table5Run("MARGE", "Train One", (x,), (x,)) for x in langs]
    plan += [Table5Run(init, "Train All", langs, langs) for init in FINETUNED_INITS]
    plan += [Table5Run("MARGE", "Zero-shot Transfer", tuple(y for y in langs if y != x), (x,)) for x in langs]
    return plan


def x_to_en_rows(split: str, languages: tuple[str, ...], images: slice) -> tuple[list[str], list[str], list[str]]:
    """(source languages, sources, English references) of the captions of `images`, interleaved by image, so
    that the first rows (the part validation reads) hold every language."""
    m30k = load_multi30k(split, sources=languages, target="en")
    rows = [(i, j) for i in range(len(m30k))[images] for j in range(len(languages))]
    return [languages[j] for _, j in rows], [m30k.sources[j][i] for i, j in rows], [m30k.target[i] for i, _ in rows]


def encode_into_english(tokenizer, langs: list[str], sources: list[str], references: list[str], layout: str):
    """An EncodedCorpus in MARGE's layout (`zero_shot_corpus`) or the denoiser's (source tagged with its language)."""
    from msgcore.batching import EncodedCorpus
    from msgcore.noising import tagged_source, tagged_target

    if layout == "marge":
        return zero_shot_corpus(tokenizer, sources, references, "en")
    source_ids = [tagged_source(ids, tokenizer, lang) for ids, lang in zip(tokenizer.encode_batch(sources), langs)]
    target_ids = [tagged_target(ids, tokenizer, "en") for ids in tokenizer.encode_batch(references)]
    return EncodedCorpus([source_ids], target_ids, tokenizer.bos_id, tokenizer.eos_id)


def table5_data(ch: MargeChapter, languages: tuple[str, ...], layout: str):
    """Fine-tuning data of one Table 5 run: the last `table5_images` Multi30k training images, validated on val."""
    train_images = slice(-ch.scale.table5_images, None)
    val_images = slice(0, ch.scale.finetune.valid_max_sentences or None)
    corpora, encoded = {}, {}
    for split, images in (("train", train_images), ("val", val_images)):
        langs, sources, refs = x_to_en_rows(split, languages, images)
        corpora[split] = Corpus("multi30k", split, ("+".join(languages),), "en", [sources], refs)
        encoded[split] = encode_into_english(ch.tokenizer, langs, sources, refs, layout)
    return TranslationData(ch.tokenizer, corpora, encoded)


def table5_model(ch: MargeChapter, run: Table5Run, seed: int):
    """The run's initialisation on `seed`, frozen as §3 says for Zero-shot Transfer; and its data layout."""
    model = initialisation(ch, run.init, seed)
    if run.setting == "Zero-shot Transfer":
        model.freeze_for_zero_shot_transfer()
    return model, "marge" if run.init == "MARGE" else "denoiser"


def table5_config(ch: MargeChapter, run: Table5Run, seed: int) -> TrainConfig:
    """A Table 5 run's recipe: `table5_steps` updates per training language (every language gets as many)."""
    steps = ch.scale.table5_steps * len(run.train_languages)
    return replace(ch.scale.finetune, max_steps=steps, seed=seed, warmup_steps=max(steps // 10, 1),
                   validate_every=max(steps // VALIDATIONS, 1), log_every=max(steps // 10, 1))


def table5_runs(ch: MargeChapter, seed: int, out_dir) -> None:
    """Every fine-tuning run of `table5_plan` on `seed`, through the run cache; ch.table5 holds
    (Table5Run, seed, RunResult, layout) for each."""
    for i, run in enumerate(table5_plan()):
        model, layout = table5_model(ch, run, seed)
        data = table5_data(ch, run.train_languages, layout)
        result = train_model(model, data, table5_config(ch, run, seed), ch.device,
                             Path(out_dir) / f"table5-{i}-seed{seed}")
        ch.table5.append((run, seed, result, layout))


def table5_outputs(ch: MargeChapter, beam_size: int | None = None) -> list[dict]:
    """One row per (run, seed, test language): the run's English translations of the test captions."""
    from msgcore.generation import GenerationConfig
    from msgcore.trainer import translate_encoded

    rows = []
    for run, seed, result, layout in ch.table5:
        for x in run.test_languages:
            encoded = encode_into_english(ch.tokenizer, [x] * len(ch.texts[x]), ch.texts[x], ch.texts["en"], layout)
            hyps = translate_encoded(result.model, ch.tokenizer, encoded, ch.device,
                                     GenerationConfig(beam_size=beam_size or ch.scale.beam_size))
            rows.append({"init": run.init, "setting": run.setting, "seed": seed, "language": x, "hyps": hyps})
    return rows


# ---- the paper's numbers (Lewis et al. 2020, read from the paper's text; notes part B.3) ---------------

PAPER_TABLES = {
    # Table 2 (a): zero-shot document-level BLEU, no fine-tuning. IWSLT2017 columns plus WMT19 de.
    "table2a": {"Into English": {"ar": 26.8, "de": 28.5, "fr": 34.3, "ja": 12.6, "zh": 19.9, "WMT19 de": 35.8},
                "From English": {"ar": 12.9, "de": 14.4, "fr": 25.5, "ja": 10.7, "zh": 12.9, "WMT19 de": 13.4}},
    # Table 2 (b): between languages (rows = source, columns = target).
    "table2b": {"de": {"en": 30.6, "it": 14.0, "nl": 14.8, "ro": 11.6},
                "en": {"de": 18.8, "it": 14.3, "nl": 15.0, "ro": 14.0},
                "it": {"de": 14.0, "en": 31.7, "nl": 11.3, "ro": 12.7},
                "nl": {"de": 14.3, "en": 27.5, "it": 12.6, "ro": 9.3},
                "ro": {"de": 14.3, "en": 32.8, "it": 14.4, "nl": 9.8}},
    # Table 3: unsupervised sentence retrieval on BUCC, F1.
    "table3": {"mBERT": {"de": 62.5, "fr": 62.6, "ru": 51.8, "zh": 50.0, "avg": 56.7},
               "MMTE": {"de": 67.9, "fr": 63.9, "ru": 54.3, "zh": 53.3, "avg": 59.8},
               "XLM": {"de": 56.3, "fr": 63.9, "ru": 60.6, "zh": 46.6, "avg": 56.8},
               "XLM-R": {"de": 67.5, "fr": 66.5, "ru": 73.5, "zh": 56.7, "avg": 66.0},
               "MARGE": {"de": 78.8, "fr": 75.9, "ru": 77.3, "zh": 71.6, "avg": 75.9}},
    # Table 5: ROUGE-L on MLSum (de, es, fr, ru, tr, avg); the rows the protocol substitute mirrors.
    "table5": {"Lead 3 (Deterministic)": 13.65, "Pointer-Generator (Train One)": 15.91, "M-BERT (Train One)": 17.59,
               "MARGE-NEWS (Zero-shot Transfer)": 15.05, "MARGE-NEWS (Train One)": 19.03, "MARGE (Train All)": 18.87,
               "MARGE-NEWS (Train All)": 19.09},
    # Table 4: supervised document-level MT, BLEU (en-de WMT19, zh-en IWSLT2015).
    "table4": {"Random Initialization": {"en-de": 7.7, "zh-en": 3.2}, "mBART (sentence)": {"en-de": 38.0, "zh-en": 28.4},
               "mBART (document)": {"en-de": 38.5, "zh-en": 29.6}, "MARGE": {"en-de": 39.2, "zh-en": 28.4}},
    # Figure 2 (Wikipedia): % of a target language's links to its own language (diagonal), some rows.
    "figure2_diagonal": {"de": 42.1, "en": 53.1, "fr": 41.3, "ru": 73.7, "bg": 36.4, "ja": 85.9, "zh": 90.3},
    "figure2_offdiagonal": {"de→en": 14.8, "bg→ru": 25.1, "es→en": 15.9, "ja→zh": 6.7},
}


# ---- the claims, declared before the runs, and the systems that judge them (msgcore.verdicts) ------------

# test sets and metrics: the keys of every system's measures
VAL = "Multi30k val comparable documents"
FLICKR = "test_2016_flickr captions"
DE_EN = "test_2016_flickr de→en"
X_EN = "test_2016_flickr de/fr/cs→en (mean)"
DE_BOTH_WAYS = "test_2016_flickr de→en vs en→de"
TED_TEST = "TED test talks, De→En"
BLEU = "BLEU"
RELATIVE_BLEU = "BLEU as % of the supervised system's (chapter 0)"
VAL_P1 = "P@1 of g within a shard's worth of images (%)"
TEST_P1 = "P@1, mean-pooled encoder, 12 directions (%)"
CROSS_SHARE = "cross-lingual share of each caption's 4 nearest captions by g (%)"
DEV_METRIC = "valid_p_at_1"  # a pre-training run's dev score: the val P@1 of g, in %, at every index refresh
# what exactly each per-query measure counts (its `verdicts.Measure` signature)
VAL_P1_SIGNATURE = ("P@1 of g, cross-lingual, per val document with a related document in another language, ranked "
                    "among the documents of its pool of `shard_images` images, in %")
TEST_P1_SIGNATURE = "P@1 of the mean-pooled encoder output among the test captions, per caption, 12 directions, %"
CROSS_SHARE_SIGNATURE = "per test caption in each language, the share of its 4 nearest other captions by g in another language, %"
NEAREST = 4  # Figure 2's view without the index's quotas: each test caption's nearest other captions by g

# systems (the fine-tuned ones are named by `ted_system` and `table5_system`; ablations by their ABLATIONS key)
MARGE, MARGE_FIRST = "MARGE", "MARGE, first seed"
MARGE_INTO, MARGE_FROM = "MARGE, de→en", "MARGE, en→de"  # zero-shot, each as a share of its supervised system's BLEU
MARGE_SHORT = "MARGE, ablation length"  # the main recipe at `ablation_steps`, the ablations' reference
START = "MARGE's start (untrained)"
RANDOM_START = "random init (untrained)"
COPY, CONSTANT = "copy input", "best constant"
NO_BETA = "β = 0 (no relevance bias)"
RANDOM_INIT = "random initialisation (the paper's start)"

# gates: the notebook measures them under these names (`chapter_gates`)
GATE_LOSS = "reconstruction trained: last / first-period loss (worst seed)"
GATE_P1 = "MARGE val P@1 of g (worst seed)"
GATE_GAIN = "retrieval is learnt: val P@1 gain over the run's own start (worst seed)"
GATE_SPREAD = "no relevance collapse: std of f on val (worst seed)"
GATE_FT = "fine-tuning works: control-initialised TED s-BLEU above the best floor (copy, constant; worst seed)"
GATE_FT_MARGE = "fine-tuning helps MARGE: TED s-BLEU fine-tuned minus zero-shot (worst seed)"
GATE_T5 = "fine-tuning works: control Train All mean X→en BLEU above the best floor (copy, constant; worst seed)"
RETRIEVAL_GATES = (GATE_P1, GATE_GAIN, GATE_SPREAD)
TED_GATES = (GATE_FT, GATE_FT_MARGE)
GATES = (GATE_LOSS, *RETRIEVAL_GATES, *TED_GATES, GATE_T5)


def ted_system(init: str) -> str:
    """The name of Table 4's system fine-tuned on TED from `init`."""
    return f"{init}, fine-tuned on TED"


def table5_system(init: str, setting: str) -> str:
    """The name of a Table 5 protocol system: its initialisation and setting (Train One, Train All, ...)."""
    return f"{init}, {setting}"


def ablation_system(name: str) -> str:
    """The name of an ablation's system (the "MARGE" row is the main recipe at the ablations' length)."""
    return MARGE_SHORT if name == "MARGE" else name


def declared_claims(scale_name: str) -> list[V.Claim]:
    """Chapter 3's claims, declared before any run: the paper's figures, the systems each compares on which test
    set, their floors (copying the input, the best constant caption, the untrained start), the smallest effect of
    each "better" claim (half the paper's delta at our level: `paper_baseline`), each parity claim's margin (the
    paper's largest gap, at our level) or a declared margin, and the gates they rest on. Every claim that MARGE
    beats denoising compares it with the control: the denoiser trained on, on MARGE's documents, for MARGE's
    updates and target tokens. Every scale declares the same claims; Table 5's are "not run" at a scale without its
    protocol."""
    scale = get_marge_scale(scale_name)
    generation = (COPY, CONSTANT)
    t5 = {"metric": BLEU, "test_set": X_EN, "gates": (*RETRIEVAL_GATES, GATE_T5),
          "cost": "" if scale.table5_steps else f"the Table 5 protocol's {len(table5_plan())} fine-tuning runs per "
                                                "seed (`table5_plan`), which this scale does not run"}
    return [
        V.Claim("S2.1-random-init", "Retrieval is learnt jointly with reconstruction from a random initialisation "
                f"(§2.1): val P@1 of g after {scale.ablation_steps:,} updates vs the same model untrained",
                "no number: 'the model is able to learn from a random initialization' (§2.1)", "better",
                RANDOM_INIT, VAL_P1, VAL, baseline=RANDOM_START, gates=(GATE_LOSS,)),
        V.Claim("T3-retrieval", "MARGE's embeddings retrieve translations better than those of a model pre-trained by "
                "denoising (Table 3): against the control, the denoiser trained on for MARGE's budget on MARGE's "
                "documents", "BUCC F1, mean of 4 languages: MARGE 75.9 vs XLM-R 66.0 (+9.9)", "better", MARGE,
                TEST_P1, FLICKR, baseline=CONTROL, paper_delta=9.9, paper_baseline=66.0,
                floors=(RANDOM_START,), gates=RETRIEVAL_GATES),  # MARGE's start is the denoiser: no floor for both
        V.Claim("T2-zero-shot", "Zero-shot de→en translation with no fine-tuning is non-trivial (Table 2): MARGE "
                "beats its untrained start, above the floors",
                "de→en 28.5 BLEU (IWSLT17), 35.8 (WMT19); 'non-trivial with even distantly related languages'",
                "better", MARGE, BLEU, DE_EN, baseline=START, floors=generation, gates=RETRIEVAL_GATES),
        V.Claim("S1-no-bitext", "No bitext is needed (§1): pre-trained on documents none of which translates "
                "another, MARGE translates de/fr/cs→en zero-shot better than its untrained start, above the floors",
                "pre-trained on CC-News and Wikipedia with no aligned data; de→en 35.8 BLEU (WMT19)", "better",
                MARGE, BLEU, X_EN, baseline=START, floors=generation, gates=RETRIEVAL_GATES),
        V.Claim("T2-into-vs-from", "Translating into English scores higher than from English (Table 2). Each "
                "zero-shot direction is measured as a share of chapter 0's supervised system in the same direction "
                "(of the same seed, on the same test captions), so that the gap is the zero-shot decoder's and not "
                "the target languages'; floors: those of de→en, as shares of the supervised de→en",
                "IWSLT17 mean of ar/de/fr/ja/zh: into English 24.4 vs from English 15.3 BLEU (+9.1); de 28.5 vs "
                "14.4", "better", MARGE_INTO, RELATIVE_BLEU, DE_BOTH_WAYS, baseline=MARGE_FROM, paper_delta=9.1,
                margin=0.0, margin_reason="the paper claims only the direction ('in all cases'): any certain gain "
                "counts", floors=generation, gates=RETRIEVAL_GATES),
        V.Claim("F2-cross-lingual", "The retriever links documents across languages (Figure 2): the share of other "
                f"languages among each test caption's {NEAREST} nearest captions by g (no index quotas), MARGE "
                "against its untrained start", "Wikipedia: 47-59% of the links of de, en and fr targets are to "
                "other languages (diagonals 42.1, 53.1, 41.3%)", "better", MARGE, CROSS_SHARE, FLICKR,
                baseline=START, margin=0.0, margin_reason="Figure 2 gives no untrained figure: any certain rise in "
                "the cross-lingual share counts", gates=RETRIEVAL_GATES),
        V.Claim("T4-vs-random", "MARGE fine-tuned beats random initialisation by far (Table 4)",
                "en-de 39.2 vs 7.7 BLEU (+31.5)", "better", ted_system("MARGE"), BLEU, TED_TEST,
                baseline=ted_system("random init"), paper_delta=31.5, paper_baseline=7.7, floors=generation,
                gates=TED_GATES),
        V.Claim("T4-vs-mBART", "MARGE fine-tuned performs similarly to mBART (Table 4): no worse than the control "
                "(the denoiser trained on for MARGE's budget) by more than the paper's largest gap between the two, "
                "at our level", "en-de 39.2 vs 38.0 / 38.5, zh-en 28.4 vs 28.4 / 29.6 (mBART sentence / document): "
                "within 1.2 BLEU", "parity", ted_system("MARGE"), BLEU, TED_TEST, baseline=ted_system(CONTROL),
                paper_delta=-1.2, paper_baseline=29.6, floors=generation, gates=TED_GATES),
        V.Claim("abl-beta", "The relevance bias β·f is what teaches retrieval (§2.2: f learns only through Eq. 4): "
                f"val P@1 of g at {scale.ablation_steps:,} updates", "no ablation in the paper", "better",
                MARGE_SHORT, VAL_P1, VAL, baseline=NO_BETA, gates=RETRIEVAL_GATES),
        V.Claim("T5-vs-control", "MARGE fine-tunes better than a model pre-trained by denoising (Table 5 protocol, "
                "X→en, Train All), against the control", "MARGE-NEWS 19.03 vs M-BERT 17.59 mean ROUGE-L, Train One "
                "(+1.44)", "better", table5_system("MARGE", "Train All"), baseline=table5_system(CONTROL, "Train All"),
                paper_delta=1.44, paper_baseline=17.59, floors=generation, **t5),
        V.Claim("T5-vs-random", "MARGE fine-tunes better than no pre-training (Table 5 protocol, X→en, Train All)",
                "MARGE-NEWS 19.03 vs Pointer-Generator 15.91 (+3.12)", "better", table5_system("MARGE", "Train All"),
                baseline=table5_system("random init", "Train All"), paper_delta=3.12, paper_baseline=15.91,
                floors=generation, **t5),
        V.Claim("T5-transfer-vs-zero-shot", "Zero-shot transfer to an unseen language beats the model it starts "
                "from (Table 5 protocol, X→en): MARGE fine-tuned on the other languages against MARGE with no "
                "fine-tuning, the analogue of the paper's extractive baseline", "MARGE-NEWS Zero-shot Transfer 15.05 "
                "vs Lead 3 13.65 (+1.40)", "better", table5_system("MARGE", "Zero-shot Transfer"), baseline=MARGE,
                paper_delta=1.40, paper_baseline=13.65, floors=generation, **t5),
        V.Claim("T5-one-vs-transfer", "Training on the language itself beats zero-shot transfer (Table 5 protocol, "
                "X→en)", "Train One 19.03 vs Zero-shot Transfer 15.05 (+3.98)", "better",
                table5_system("MARGE", "Train One"), baseline=table5_system("MARGE", "Zero-shot Transfer"),
                paper_delta=3.98, paper_baseline=15.05, floors=generation, **t5),
        V.Claim("T5-all-vs-one", "Training on all languages is no worse than training on each (Table 5 protocol, "
                "X→en)", "MARGE Train All 18.87, MARGE-NEWS Train All 19.09 vs Train One 19.03; at most 0.62 lower "
                "in one language (tr 36.09 → 35.47)", "parity", table5_system("MARGE", "Train All"),
                baseline=table5_system("MARGE", "Train One"), paper_delta=-0.62, paper_baseline=36.09,
                floors=generation, **t5),  # the largest Train All drop: tr 36.09 → 35.47
    ]


def gate_bars(scale: MargeScale) -> dict[str, dict]:
    """Each gate's bar (`verdicts.Gate` fields): its target, its direction and the paper's own figure for the same
    check, with the paper's value where its own systems have one (no target may be stricter than it)."""
    return {
        GATE_LOSS: dict(target=0.8, higher_is_better=False,
                        paper="none: the paper reports no pre-training loss"),
        GATE_P1: dict(target=scale.min_p_at_1, paper_value=0.759,
                      paper="no P@1 of g on held-out text; MARGE's BUCC F1, the nearest check, is 0.759 (Table 3)"),
        GATE_GAIN: dict(target=scale.min_gain,
                        paper="none: no retrieval curve; it learns retrieval from a random initialisation (§2.1)"),
        GATE_SPREAD: dict(target=0.01, paper="none: a sanity check of ours (a collapsed f has no spread)"),
        GATE_FT: dict(target=scale.min_finetune_margin,
                      paper="none: Table 4 has no floor; its fine-tuned systems score 7.7 (random init) to 39.2 BLEU"),
        GATE_FT_MARGE: dict(target=scale.min_finetune_gain, paper_value=25.8,
                            paper="WMT19 en-de: MARGE fine-tuned 39.2 (Table 4) vs zero-shot 13.4 (Table 2), +25.8"),
        GATE_T5: dict(target=scale.min_finetune_margin, paper_value=3.94,
                      paper="M-BERT (Train One) 17.59 vs Lead 3 13.65 ROUGE-L on MLSum (Table 5), +3.94"),
    }


def chapter_gates(scale: MargeScale, values: dict[str, float]) -> list[V.Gate]:
    """The gates measured at this scale (name -> our value; a gate whose runs this scale skips is left out)."""
    bars = gate_bars(scale)
    return [V.Gate(name, value, **bars[name]) for name, value in values.items()]


@dataclass
class Evidence:
    """What the chapter's cells produced, for `chapter_systems`: every system's outputs or per-query statistics, so
    that each score carries its bootstrap replicates, keyed by the seed id of the run behind it."""

    zero_shot: dict[tuple[int, str, str], list[str]]  # (seed, source, target) -> MARGE's outputs, test captions
    start: dict[str, list[str]]  # source language -> the untrained start's zero-shot X→en outputs (every seed's
    #                              start is the same: the denoiser's weights and β at its initial value)
    supervised: dict[tuple[int, str, str], list[str]]  # (seed, source, target) -> chapter 0's outputs, de↔en
    ablations: dict[tuple[str, int], list[str]]  # (ABLATIONS name, seed) -> zero-shot de→en outputs
    test_p1: dict[str, dict[int, np.ndarray]]  # MARGE, CONTROL, DENOISER, START, RANDOM_START -> seed -> statistics
    cross_share: dict[str, dict[int, np.ndarray]]  # MARGE, START -> seed -> `cross_share_statistics`
    ted: dict[tuple[str, int], list[str]]  # (initialisation, seed) -> TED test outputs after fine-tuning
    table5: dict[str, dict[int, dict[str, list[str]]]]  # `table5_system` -> seed -> test language -> outputs
    constant: str  # the best constant caption (chosen among the val captions)
    ted_constant: str  # the best constant TED sentence (chosen on the TED val talks)


# ---- measures: every score with its bootstrap over test sentences or queries ----------------------------------

def mean_bleu_measure(outputs: dict[int, list[list[str]]], references: list[list[str]]) -> V.Measure:
    """The mean BLEU of several directions on the same test captions (seed -> outputs per direction): caption i of
    every direction is one row of statistics, so the bootstrap resamples captions and keeps the directions paired."""
    scorer = statistics_scorer("bleu")
    signature = f"mean over {len(references)} directions of " + corpus_score("bleu", references[0],
                                                                             references[0]).signature

    def mean_bleu(totals) -> float:
        return statistics.fmean(scorer(part) for part in np.split(np.asarray(totals), len(references)))
    return V.statistics_measure({seed: np.hstack([sentence_statistics("bleu", hyps, refs)
                                                  for hyps, refs in zip(by_direction, references)])
                                 for seed, by_direction in outputs.items()}, mean_bleu, signature)


def relative_bleu_measure(outputs: dict[int, list[str]], supervised: dict[int, list[str]],
                          references: list[str]) -> V.Measure:
    """BLEU as a % of a supervised system's on the same test captions (seed -> outputs of each): caption i's
    statistics of both are one row, so the bootstrap resamples captions and keeps the pair together."""
    scorer = statistics_scorer("bleu")
    signature = "100 × BLEU / the supervised system's BLEU, " + corpus_score("bleu", references, references).signature

    def relative(totals) -> float:
        ours, theirs = np.split(np.asarray(totals), 2)
        return 100.0 * scorer(ours) / max(scorer(theirs), 1e-9)
    return V.statistics_measure({seed: np.hstack([sentence_statistics("bleu", outputs[seed], references),
                                                  sentence_statistics("bleu", supervised[seed], references)])
                                 for seed in outputs}, relative, signature)


def rate_measure(statistics_by_seed: dict[int, np.ndarray], signature: str) -> V.Measure:
    """A rate in % (P@1, a share) from per-query `rate_statistics`, with its bootstrap over the queries."""
    return V.statistics_measure(statistics_by_seed, rate_score, signature)


def val_p1_measure(by_seed: dict[int, np.ndarray]) -> V.Measure:
    return rate_measure(by_seed, VAL_P1_SIGNATURE)


def test_p1_measure(by_seed: dict[int, np.ndarray]) -> V.Measure:
    return rate_measure(by_seed, TEST_P1_SIGNATURE)


def cross_share_measure(by_seed: dict[int, np.ndarray]) -> V.Measure:
    return rate_measure(by_seed, CROSS_SHARE_SIGNATURE)


def statistics_floor(name: str, test_set: str, metric: str, measure_of, values) -> V.System:
    """A floor whose one score is a per-query measure (`measure_of({FLOOR: values})`), with its replicates."""
    measure = measure_of({V.FLOOR: values})
    return V.floor_system(name, test_set, metric, measure.scores[V.FLOOR], measure.sentences, measure.signature,
                          measure.replicates[V.FLOOR])


@torch.no_grad()
def cross_share_statistics(model, tokenizer, texts: dict[str, list[str]], order, k: int = NEAREST) -> np.ndarray:
    """Figure 2 without the index's quotas, per test caption: row i holds, summed over caption i in every language,
    how many of its k nearest other captions by g are in another language, and k per language (`rate_statistics`
    layout: hits, trials), so that `rate_score` of summed rows is the cross-lingual share in %."""
    n = len(texts[order[0]])
    g = torch.cat([embed_documents(model, tokenizer.encode_batch(texts[lang]), tokenizer.bos_id, tokenizer.eos_id,
                                   tokenizer.pad_id) for lang in order])  # (L * n, d), language blocks
    f = g @ g.T  # (L * n, L * n) cosines, Eq. (1)
    f.fill_diagonal_(float("-inf"))
    nearest = f.topk(min(k, len(g) - 1), dim=1).indices  # (L * n, k)
    other = (nearest // n != torch.arange(len(g))[:, None] // n).sum(1).float()  # (L * n,)
    per_caption = other.view(len(order), n).sum(0).numpy()  # (n,)
    return np.column_stack([per_caption, np.full(n, float(nearest.size(1) * len(order)))])


# ---- stages: every training a system went through, with its dev curve, dev noise and budget ------------------

def pretraining_history(log: list[dict]) -> list[dict]:
    """A pre-training log as Trainer-style validation rows for `msgcore.verdicts.stage_from_history`: at every index
    refresh and at the end, the update count, the val P@1 of g in %, the budget trained on so far, and the dev
    noise as the core Trainer records it (the paired bootstrap standard error, over the val queries, of the P@1
    change since the best validation so far; None at the first)."""
    rows, best = [], None
    for row in log:
        noise = None if best is None else p1_change_noise(row["hits"], best["hits"])
        rows.append({"kind": "valid", "step": row["step"], DEV_METRIC: 100 * row["p_at_1"], "valid_noise": noise,
                     "source_tokens": row["source_tokens"], "target_tokens": row["target_tokens"]})
        if best is None or row["p_at_1"] > best["p_at_1"]:
            best = row
    return rows


def p1_change_noise(hits, best_hits) -> float:
    """The bootstrap standard error of the P@1 change (in points) between two validations of the same queries."""
    return paired_standard_error(rate_statistics(hits), rate_statistics(best_hits), rate_score)


def pretraining_stage(run: MargeRun, scale: MargeScale, steps: int, change: dict | None = None) -> V.Stage:
    """A MARGE pre-training run as a stage: its val P@1 curve, dev noise and tokens (`pretraining_history`).
    Judged on its plateau, as every stage of ours: the paper's schedule also ends at a fixed length, but it reports
    no curve that would show where its run stood."""
    change = change or {}
    every = scale.retrieval.refresh_every * change.get("refresh_factor", 1)
    schedule = (f"MARGE: lr {scale.lr:g}, warmup {scale.warmup}, linear decay to 0 at {steps:,}; batches of "
                f"≤ {scale.retrieval.max_tokens} tokens and ≤ {scale.retrieval.max_docs} documents; index every "
                f"{every}")
    return V.stage_from_history("MARGE pre-training", pretraining_history(run.log), patience=0, metric=DEV_METRIC,
                                schedule=schedule)


def trainer_stage(name: str, history: list[dict], cfg: TrainConfig) -> V.Stage:
    """A core Trainer run (the denoiser's pre-training, a fine-tuning run) as a stage, from its whole history."""
    return V.stage_from_history(name, history, cfg.patience, schedule=V.schedule_of(cfg))


def denoiser_stage(ch: MargeChapter) -> V.Stage:
    return trainer_stage("denoising pre-training", ch.denoiser.run.history, ch.denoiser.scale.pretrain)


def control_stages(ch: MargeChapter, seed: int) -> tuple[V.Stage, ...]:
    """The control's stages: the denoiser's pre-training, then its continuation on MARGE's documents."""
    run, cfg = ch.controls[seed]
    return denoiser_stage(ch), trainer_stage("denoising continued on MARGE's documents", run.history, cfg)


def marge_stages(ch: MargeChapter, seed: int) -> tuple[V.Stage, ...]:
    """A main run's stages: the denoiser's pre-training when the scale warm-starts from it, then MARGE's."""
    before = (denoiser_stage(ch),) if ch.scale.from_denoiser else ()
    return (*before, pretraining_stage(ch.main(seed), ch.scale, ch.scale.steps))


def ablation_stages(ch: MargeChapter, name: str, seed: int) -> tuple[V.Stage, ...]:
    change = ABLATIONS[name]
    warm = ch.scale.from_denoiser and change.get("init") != "random"
    run = ch.runs[name, seed, ch.scale.ablation_steps]
    return (*((denoiser_stage(ch),) if warm else ()), pretraining_stage(run, ch.scale, ch.scale.ablation_steps, change))


def init_stages(ch: MargeChapter, init: str, seed: int) -> tuple[V.Stage, ...]:
    """What a fine-tuning run's initialisation trained before it (`initialisation`): nothing (random init), the
    denoiser's pre-training, the control's stages, or MARGE's main run of that seed with the stages before it."""
    if init == "random init":
        return ()
    stages = {DENOISER: lambda: (denoiser_stage(ch),), CONTROL: lambda: control_stages(ch, seed),
              "MARGE": lambda: marge_stages(ch, seed)}
    return stages[init]()


# ---- the systems -----------------------------------------------------------------------------------------------

def caption_floors(ch: MargeChapter, ev: Evidence) -> dict[str, V.System]:
    """Copying the input and the best constant, on every generation test set, scored like the systems they bound;
    on the mean test set, their into-English directions; as shares of the supervised de→en, their de→en outputs."""
    refs, ted, x = ch.texts, ch.ted["MARGE"].corpora["test"], TABLE5_LANGUAGES
    outputs = {COPY: ({lang: refs[lang] for lang in x}, ted.sources[-1]),  # the German sentence of each TED pair
               CONSTANT: ({lang: [ev.constant] * len(refs["en"]) for lang in x}, [ev.ted_constant] * len(ted))}
    first = min(k for k, _, _ in ev.supervised) if ev.supervised else None
    floors = {}
    for name, (captions, talks) in outputs.items():
        parts = [V.floor_from_outputs(name, DE_EN, BLEU, "bleu", captions["de"], refs["en"]),
                 statistics_floor(name, X_EN, BLEU, lambda m: mean_bleu_measure(m, [refs["en"]] * len(x)),
                                  [captions[lang] for lang in x]),
                 V.floor_from_outputs(name, TED_TEST, BLEU, "bleu", talks, ted.target)]
        if first is not None:  # relative to the first supervised seed's de→en
            parts.append(statistics_floor(name, DE_BOTH_WAYS, RELATIVE_BLEU, lambda m: relative_bleu_measure(
                m, {V.FLOOR: ev.supervised[first, "de", "en"]}, refs["en"]), captions["de"]))
        floors[name] = V.merged_floor(name, parts)
    return floors


def start_floors(ch: MargeChapter, ev: Evidence) -> dict[str, V.System]:
    """The untrained starts, each a floor: MARGE's (zero-shot X→en, test P@1 and the cross-lingual share) and the
    random-init MARGE's (the random-init ablation of the first seed before its first update: its log's first row)."""
    refs, x = ch.texts, TABLE5_LANGUAGES
    random_run = ch.runs[RANDOM_INIT, ch.seed, ch.scale.ablation_steps]
    return {
        START: V.merged_floor(START, [
            V.floor_from_outputs(START, DE_EN, BLEU, "bleu", ev.start["de"], refs["en"]),
            statistics_floor(START, X_EN, BLEU, lambda m: mean_bleu_measure(m, [refs["en"]] * len(x)),
                             [ev.start[lang] for lang in x]),
            statistics_floor(START, FLICKR, TEST_P1, test_p1_measure, only(ev.test_p1[START])),
            statistics_floor(START, FLICKR, CROSS_SHARE, cross_share_measure, only(ev.cross_share[START]))]),
        RANDOM_START: V.merged_floor(RANDOM_START, [
            statistics_floor(RANDOM_START, VAL, VAL_P1, val_p1_measure, rate_statistics(random_run.log[0]["hits"])),
            statistics_floor(RANDOM_START, FLICKR, TEST_P1, test_p1_measure, only(ev.test_p1[RANDOM_START]))])}


def only(by_seed: dict):
    """The one entry of a floor's evidence (it has no seeds)."""
    (value,) = by_seed.values()
    return value


def pretrained_systems(ch: MargeChapter, ev: Evidence) -> dict[str, V.System]:
    """MARGE after pre-training, zero-shot (one run per seed, every stage), the control, the denoiser (context,
    trained once) and the ablations, every seed."""
    refs, seeds, x = ch.texts, ch.seeds, TABLE5_LANGUAGES
    runs = [V.RunRecord(k, marge_stages(ch, k)) for k in seeds]
    systems = {MARGE: V.System(MARGE, {
        DE_EN: {BLEU: V.text_measure("bleu", {k: ev.zero_shot[k, "de", "en"] for k in seeds}, refs["en"])},
        X_EN: {BLEU: mean_bleu_measure({k: [ev.zero_shot[k, a, "en"] for a in x] for k in seeds}, [refs["en"]] * 3)},
        FLICKR: {TEST_P1: test_p1_measure(ev.test_p1[MARGE]), CROSS_SHARE: cross_share_measure(ev.cross_share[MARGE])}},
        runs)}
    paired = [k for k in seeds if (k, "de", "en") in ev.supervised and (k, "en", "de") in ev.supervised]
    for name, (a, b) in ((MARGE_INTO, ("de", "en")), (MARGE_FROM, ("en", "de"))):
        systems[name] = V.System(name, {DE_BOTH_WAYS: {RELATIVE_BLEU: relative_bleu_measure(
            {k: ev.zero_shot[k, a, b] for k in paired}, {k: ev.supervised[k, a, b] for k in paired}, refs[b])}},
            [run for run in runs if run.seed in paired])
    systems[CONTROL] = V.System(CONTROL, {FLICKR: {TEST_P1: test_p1_measure(ev.test_p1[CONTROL])}},
                                [V.RunRecord(k, control_stages(ch, k)) for k in seeds])
    systems[DENOISER] = V.System(DENOISER, {FLICKR: {TEST_P1: test_p1_measure(ev.test_p1[DENOISER])}},
                                 [V.RunRecord(ch.seed, (denoiser_stage(ch),))])
    for name in ABLATIONS:
        system = ablation_system(name)
        logs = {k: ch.runs[name, k, ch.scale.ablation_steps].log for k in seeds}
        systems[system] = V.System(system, {
            VAL: {VAL_P1: val_p1_measure({k: rate_statistics(log[-1]["hits"]) for k, log in logs.items()})},
            DE_EN: {BLEU: V.text_measure("bleu", {k: ev.ablations[name, k] for k in seeds}, refs["en"])}},
            [V.RunRecord(k, ablation_stages(ch, name, k)) for k in seeds])
    return systems


def finetuned_systems(ch: MargeChapter, ev: Evidence) -> dict[str, V.System]:
    """Table 4's and Table 5's systems on every seed, each run with its initialisation's stages before its
    fine-tuning: their budgets differ by that pre-training. A Table 5 system trained as several runs (Train One,
    Zero-shot Transfer: one per test language) lists each run's fine-tuning as a stage of its own."""
    ted = ch.ted["MARGE"].corpora["test"]
    systems = {}
    for init in FINETUNED_INITS:
        seeds = [k for k in ch.seeds if (init, k) in ch.finetuned]
        if not seeds:
            continue
        runs = [V.RunRecord(k, (*init_stages(ch, init, k), trainer_stage(
            "TED fine-tuning", ch.finetuned[init, k].history, ted_config(ch, k)))) for k in seeds]
        systems[ted_system(init)] = V.System(ted_system(init), {TED_TEST: {BLEU: V.text_measure(
            "bleu", {k: ev.ted[init, k] for k in seeds}, ted.target)}}, runs)
    runs5: dict[str, dict[int, list]] = {}
    for run, seed, result, _ in ch.table5:
        runs5.setdefault(table5_system(run.init, run.setting), {}).setdefault(seed, []).append((run, result))
    x, refs = TABLE5_LANGUAGES, ch.texts["en"]
    for name, by_seed in runs5.items():
        records = [V.RunRecord(k, (*init_stages(ch, runs[0][0].init, k), *(trainer_stage(
            f"Table 5 fine-tuning ({'+'.join(run.train_languages)})", result.history, table5_config(ch, run, k))
            for run, result in runs))) for k, runs in by_seed.items()]
        systems[name] = V.System(name, {X_EN: {BLEU: mean_bleu_measure(
            {k: [ev.table5[name][k][a] for a in x] for k in by_seed}, [refs] * len(x))}}, records)
    return systems


def chapter_systems(ch: MargeChapter, ev: Evidence) -> dict[str, V.System]:
    """Every system the claims name, keyed by name: the floors, the pre-trained systems and the fine-tuned ones,
    each score with its bootstrap replicates and each trained system with one run per seed, every stage in it."""
    return {**caption_floors(ch, ev), **start_floors(ch, ev), **pretrained_systems(ch, ev),
            **finetuned_systems(ch, ev)}


# ---- the supervised reference: chapter 0's Transformers, de↔en --------------------------------------------------

def supervised_runs(ch: MargeChapter, scale_name: str, out_dir, part: tuple[int, int] = (0, 1)):
    """Chapter 0's supervised Transformers, De→En and En→De, on its seeds (`msgcore.foundations.baselines`: the
    same run-cache entries as chapter 0's, so trained once; with `part`, this process's share of its seeds):
    direction -> seed -> run, and their data."""
    from msgcore.foundations.baselines import BASELINE_SCALES, baseline_data, train_baselines
    from msgcore.recipes import get_scale

    data = baseline_data(get_scale(BASELINE_SCALES, scale_name), ch.seed)
    return train_baselines(scale_name, ch.device, Path(out_dir) / "baselines", ch.seed, data, part), data


def supervised_outputs(ch: MargeChapter, runs, data) -> dict[tuple[int, str, str], list[str]]:
    """(seed, source, target) -> chapter 0's translations of the chapter's test captions, decoded as MARGE's are."""
    from msgcore.batching import encode_corpus
    from msgcore.generation import GenerationConfig
    from msgcore.trainer import translate_encoded

    out = {}
    for direction, by_seed in runs.items():
        corpus = data[direction].corpora["test_2016_flickr"]
        corpus = corpus.subset(range(len(ch.texts["en"])))
        encoded = encode_corpus(corpus, data[direction].tokenizer)
        a, b = corpus.source_langs[0], corpus.target_lang
        for seed, run in by_seed.items():
            out[seed, a, b] = translate_encoded(run.model, data[direction].tokenizer, encoded, ch.device,
                                                GenerationConfig(beam_size=ch.scale.beam_size))
    return out


def warm_start_summary(ch: MargeChapter) -> str:
    """What the main runs' warm start copied from the denoiser, and what it left at initialisation, in one line."""
    if not ch.scale.from_denoiser:
        return "The main runs start from random initialisation (no warm start)."
    own = ch.start.state_dict()
    copied = sum(own[name].numel() for name in ch.warm_started)
    left = [name for name in own if name not in ch.warm_started]
    return (f"Warm start: {len(ch.warm_started)} of MARGE's {len(own)} tensors ({copied:,} of "
            f"{sum(t.numel() for t in own.values()):,} values) copied from the denoiser; left at initialisation: "
            f"{', '.join(left) or 'nothing'} (MARGE's own).")


def caption_references(split: str, lang: str) -> list[str]:
    """The Multi30k captions of one split in one language (the best constant's candidates and dev references)."""
    other = "de" if lang == "en" else "en"
    return list(load_multi30k(split, sources=(other,), target=lang).target)
