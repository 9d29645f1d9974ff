"""MARGE recipes (Lewis et al. 2020): documents from aligned corpora, retrieval metrics, a pre-training loop.

The data analogue (notes, part B.4): every caption of Multi30k in en/de/fr/cs is a document; the
captions of the same image in the other languages are its related documents (the paper's "equivalent
article in another language"), and they share a shard. `toy_documents` does the same with the
seeded synthetic corpus and a word-level vocabulary, for tests and smoke runs.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch

from msgcore.data import Corpus, load_multi30k, synthetic_corpus
from msgcore.retrieval import BatchConstructor, embed_documents, link_precision

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


def columns_of(corpus: Corpus) -> list[tuple[str, list[str]]]:
    """(language, sentences) for every column of an aligned corpus, sources then target."""
    return [*zip(corpus.source_langs, corpus.sources), (corpus.target_lang, corpus.target)]


def keep_overlap(groups: list[int], langs: list[str], overlap: float, seed: int = 0) -> list[int]:
    """Indices to keep: for a fraction `overlap` of the groups every language, for the others one
    random language (the notes' `translation_overlap` lever: at 0 no document has its translation)."""
    rng = random.Random(f"marge-overlap:{seed}")
    by_group: dict[int, list[int]] = {}
    for i, group in enumerate(groups):
        by_group.setdefault(group, []).append(i)
    keep = []
    for group in sorted(by_group):
        members = by_group[group]
        keep.extend(members if rng.random() < overlap else [rng.choice(members)])
    return sorted(keep)


def documents_from_corpus(corpus: Corpus, tokenizer, max_len: int = 128, overlap: float = 1.0,
                          seed: int = 0) -> Documents:
    """Every sentence of every column is a document; a row's sentences form a group."""
    pieces, langs, groups = [], [], []
    for lang, column in columns_of(corpus):
        pieces += [ids[:max_len] for ids in tokenizer.encode_batch(column)]
        langs += [lang] * len(column)
        groups += list(range(len(column)))
    keep = keep_overlap(groups, langs, overlap, seed)
    return Documents([pieces[i] for i in keep], [langs[i] for i in keep], [groups[i] for i in keep],
                     [tokenizer.lang_id(langs[i]) for i in keep])


def multi30k_documents(tokenizer, split: str = "train", languages=("de", "fr", "cs", "en"), n: int = 0,
                       max_len: int = 128, overlap: float = 1.0, seed: int = 0) -> Documents:
    """Multi30k captions in `languages` as documents (the first n images, 0 = all)."""
    corpus = load_multi30k(split, sources=tuple(languages[:-1]), target=languages[-1])
    if n:
        corpus = Corpus(corpus.name, corpus.split, corpus.source_langs, corpus.target_lang,
                        [column[:n] for column in corpus.sources], corpus.target[:n])
    return documents_from_corpus(corpus, tokenizer, max_len, overlap, seed)


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
def retrieval_metrics(model, docs: Documents, bos_id: int = BOS, eos_id: int = EOS, pad_id: int = PAD) -> dict:
    """Cross-lingual retrieval with g over the whole corpus: for each document, the documents of other
    languages ranked by f. P@1 and MRR of the nearest related document; gap = mean f of related
    minus mean f of unrelated cross-lingual pairs; spread = std of f (a collapse warning when ~0)."""
    g = embed_documents(model, docs.pieces, bos_id, eos_id, pad_id)
    codes = {lang: i for i, lang in enumerate(sorted(set(docs.langs)))}
    lang = torch.tensor([codes[x] for x in docs.langs])
    group = torch.tensor(docs.groups)
    f = g @ g.T  # (D, D)
    cross = lang[:, None] != lang[None, :]
    related = cross & (group[:, None] == group[None, :])
    has = related.any(1)
    scores = f.masked_fill(~cross, float("-inf"))
    best_related = f.masked_fill(~related, float("-inf")).amax(1, keepdim=True)
    rank = (scores > best_related).sum(1).float() + 1  # rank of the best related document
    return {"p_at_1": (group[scores.argmax(1)] == group)[has].float().mean().item(),
            "mrr": (1 / rank)[has].mean().item(),
            "gap": (f[related].mean() - f[cross & ~related].mean()).item(),
            "spread": f[cross].std().item()}


def pretrain(model, constructor: BatchConstructor, steps: int, lr: float = 1e-3, label_smoothing: float = 0.0,
             on_refresh=None) -> list[dict]:
    """A plain MARGE pre-training loop (Adam, constant lr, loss per target token).

    # Deviation: no warmup or linear decay (the paper: 1e-4 -> 0 with 10k warmup); the chapter's
    # recipe would use the core Trainer. `on_refresh(model, constructor)` returns a dict logged at
    # every refresh, after the batches are built. Returns one log row per refresh.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    log, losses, start = [], [], time.time()
    for _ in range(steps):
        model.train()
        batch = constructor.next_batch(model)
        if constructor.updates_since_refresh == 1:  # this batch opened a new index period
            row = {"refresh": constructor.refreshes, "links": len(constructor.links),
                   "batches": len(constructor.batches), "betas": model.betas(),
                   "link_precision": link_precision(constructor.links, constructor.groups, constructor.langs),
                   "loss": sum(losses) / len(losses) if losses else float("nan"), "seconds": time.time() - start}
            row.update(on_refresh(model, constructor) if on_refresh else {})
            log.append(row)
            losses = []
        loss = model.loss(batch, label_smoothing) / batch.num_target_tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return log
