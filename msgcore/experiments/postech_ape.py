"""Chapter 4's recipes: POSTECH APE (Lee, Shin, Lee, WMT 2019, §3.1-3.3, Tables 1-4).

APE triplets are a two-source corpus: sources [src (en), mt (de)] -> target pe (de), the order
`msgcore.models.postech_ape.PostechAPE` expects. One joint tokenizer serves all three columns
(§3.2: "32k shared vocabulary"); the chapter uses the shared denoiser's, with its language tags, because every
system starts from that denoising model (`msgcore.foundations.denoiser`, then `from_pretrained`).

    Table 1   the data and the eSCAPE stand-in: synthetic MT by error injection, then the paper's filter
    Table 2   four architectures (parallel/sequential x with/without the mt future mask): a generic model
              each (synthetic + official triplets), fine-tuned on the official triplets at each ratio alpha
    Table 3   the paper's three ensemble rules, chosen on dev, scored on dev and test
    Table 4   test: do-nothing, a concatenation baseline, the dual-source control (separate encoders),
              the best single model (several seeds) and the ensemble chosen on dev
    analyses  TER by MT-quality bucket, outputs left untouched, the stack-level attention, a case study
    verdicts  the claims (`declared_claims`), the two gates every APE claim rests on (`trained_gates`), every
              system's evidence keyed by seed id: its measures with bootstrap replicates and, per seed, a run with
              all its stages: pre-training, generic phase, fine-tuning (`chapter_systems`), and the floors
`run_chapter(scale, device, out_dir, seed)` trains every run (through the run cache); the notebook calls it.

The offline stand-in (tests): the seeded toy corpus gives src = toy language "xa" and pe = "xt"; mt is pe
with word-level errors (drop, substitute, swap), so copying mt is a real baseline that APE must beat.
"""
from __future__ import annotations

import logging
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from sacrebleu.metrics import TER
from torch import Tensor

from msgcore import floors, verdicts
from msgcore.batching import EncodedCorpus, encode_corpus
from msgcore.data import (SYNTHETIC_TARGET_LANG, Corpus, load_ape, load_mlqe_pe, load_multi30k, synthetic_corpus,
                          toy_lexicon)
from msgcore.foundations.denoiser import Denoiser, encode_task, pretrained_denoiser
from msgcore.generation import Ensemble, GenerationConfig
from msgcore.metrics import corpus_score, sentence_statistics, statistics_scorer
from msgcore.model import TransformerConfig
from msgcore.models.postech_ape import PostechAPE, PostechConfig, from_pretrained
from msgcore.models.trice import ONE_LONG_SEQUENCE, TriceTransformer, from_single_source
from msgcore.recipes import CPU_BOOK_SETTING, RunResult, TranslationData, get_scale, train_model
from msgcore.scoreboard import read_system
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import DataError, MsgcoreError

APE_SPLITS = {"train": "train", "val": "dev", "test": "test"}  # our split name -> load_ape's


def noisy_copy(sentence: str, rng: random.Random, lexicon: list[str], rate: float) -> str:
    """A word-level corrupted copy: each word is dropped, substituted or swapped with the next one,
    each with probability rate / 3. Never returns an empty sentence."""
    words, out, i = sentence.split(), [], 0
    while i < len(words):
        r = rng.random()
        if r < rate / 3:  # drop
            i += 1
            continue
        if r < 2 * rate / 3:  # substitute
            out.append(rng.choice(lexicon))
        elif r < rate and i + 1 < len(words):  # swap with the next word
            out.extend([words[i + 1], words[i]])
            i += 1
        else:
            out.append(words[i])
        i += 1
    return " ".join(out) or sentence


def synthetic_ape(n: int, split: str = "train", seed: int = 0, error_rate: float = 0.3,
                  vocab_size: int = 24) -> Corpus:
    """n toy triplets (src "xa", mt "xt" with errors) -> pe "xt"; same arguments -> same corpus."""
    toy = synthetic_corpus(n, num_sources=1, seed=seed, split=split, vocab_size=vocab_size)
    rng = random.Random(f"synthetic-ape:{seed}:{split}")
    lexicon = toy_lexicon(SYNTHETIC_TARGET_LANG, vocab_size)
    mt = [noisy_copy(pe, rng, lexicon, error_rate) for pe in toy.target]
    return Corpus("synthetic-ape", toy.split, (toy.source_langs[0], SYNTHETIC_TARGET_LANG), SYNTHETIC_TARGET_LANG,
                  [toy.sources[0], mt], toy.target)


def ape_corpora(seed: int = 0, allow_synthetic: bool = False) -> tuple[dict[str, Corpus], bool]:
    """(split -> corpus, synthetic): WMT16/17 APE train/val(=dev)/test, or the toy stand-in when the real
    data is unavailable and `allow_synthetic` is set (smoke runs only; it is announced)."""
    try:
        return {name: load_ape(split) for name, split in APE_SPLITS.items()}, False
    except DataError as error:
        if not allow_synthetic or "MSGCORE_DATA_MIRROR" not in str(error):
            raise
        print(f"The APE data is unavailable ({error}); using the synthetic APE triplets instead.")
        sizes = {"train": 3000, "val": 200, "test": 200}
        return {name: synthetic_ape(size, name, seed) for name, size in sizes.items()}, True


def prepare_ape(corpora: dict[str, Corpus], vocab_size: int = 8000, max_len: int = 128, train_examples: int = 0,
                eval_examples: int = 0, seed: int = 0, tokenizer: Tokenizer | None = None,
                synthetic: bool = False) -> TranslationData:
    """Cut the splits (first N examples; 0 = all), train one shared unigram tokenizer on the training
    triplets (unless given), encode every split (training examples truncated to `max_len` pieces)."""
    corpora = dict(corpora)
    for name, corpus in corpora.items():
        limit = train_examples if name == "train" else eval_examples
        if limit:
            corpora[name] = corpus.subset(range(min(limit, len(corpus))))
    if tokenizer is None:
        train = corpora["train"]
        tokenizer = Tokenizer.train(train.texts(), vocab_size=vocab_size, model_type="unigram",
                                    langs=(*train.source_langs, train.target_lang), seed=seed)
    data = TranslationData(tokenizer, corpora, synthetic=synthetic)
    for name, corpus in corpora.items():
        data.encoded[name] = encode_corpus(corpus, tokenizer, max_len=max_len if name == "train" else None)
    return data


def do_nothing(corpus: Corpus) -> list[str]:
    """The APE baseline: the mt column, unchanged."""
    return list(corpus.sources[1])


# =====================================================================================================
# The chapter: scales, the eSCAPE stand-in, the Table 2 sweep, ensembles, the test table and analyses
# =====================================================================================================

TER_CASED = dict(case_sensitive=True)  # the official APE evaluation (tercom) is case-sensitive

# Table 2's four architectures (§3.2), and the controls of the Table 4 analogue.
ARCHITECTURES: dict[str, dict] = {
    "Par w/ mask": dict(multi_source="parallel", mt_future_mask=True),
    "Par w/o mask": dict(multi_source="parallel", mt_future_mask=False),
    "Seq w/ mask": dict(multi_source="sequential", mt_future_mask=True),
    "Seq w/o mask": dict(multi_source="sequential", mt_future_mask=False),
}
DUAL = "Dual-source (separate encoders)"  # JDG-2018's structure: sequential decoder, no mt->src attention
CONTROLS: dict[str, dict] = {DUAL: dict(multi_source="sequential", mt_future_mask=False, joint_encoder=False)}
CONCAT = "Concatenation ([src; mt], one encoder)"
DO_NOTHING = "Do-nothing (MT as output)"
GENERIC = "w/o tuning"  # Table 2's name for the generic (phase-1) model


@dataclass
class PostechScale:
    denoiser_scale: str  # the DENOISER_SCALES entry (msgcore.foundations.denoiser) whose cached model starts every system
    generic: TrainConfig  # phase 1: synthetic triplets + the official ones (upsampled)
    finetune: TrainConfig  # phase 2: the official training triplets, at each teacher-forcing ratio
    ratios: tuple[float, ...] = (1.0, 0.8)  # teacher-forcing ratios alpha of Table 2 (1.0 first)
    seeds: tuple[int, ...] = (0, 1, 2)  # fine-tuning seeds of the best system and of the dual-source control
    synthetic_per_source: int = 0  # candidate synthetic triplets per parallel corpus (0 = all)
    max_error_rate: float = 1.5  # word error rates of the synthetic MT are drawn uniformly from [0, this]
    official_share: float = 1 / 3  # the official triplets' share of the generic data, after upsampling
    dev_examples: int = 0  # dev triplets scored for Table 2/3 and model selection (0 = all)
    test_examples: int = 0  # test triplets of Table 4 and the analyses (0 = all)
    beam_size: int = 1  # decoding beam (1 = greedy)
    top_n: tuple[int, ...] = (2, 4)  # Ens_set_1 sizes: the top-N fine-tuned models by dev TER
    n_bootstrap: int = 1000  # paired-bootstrap resamples
    teacher_forcing_pass: str = "incremental"  # the exact step-by-step version of §3.2 (msgcore.models.postech_ape)
    notes: str = ""  # what a reader should know about this scale


def _steps(steps: int, validations: int = 4, **kw) -> TrainConfig:
    """At most `steps` updates with `validations` evenly spaced dev-BLEU validations (the last at the end, so the
    verdict protocol can tell a converged run from one still improving at its cap), label smoothing 0.1.

    # Deviation: warm-up over a tenth of the run, at most 400 updates; the paper warms up over 18k steps with
    # batches of about 25k triplets (§4, "Settings"), a schedule for a run of its length, not ours."""
    base = dict(lr=5e-4, warmup_steps=max(min(steps // 10, 400), 1), max_tokens=1536, max_epochs=1000,
                max_steps=steps, validate_every=max(steps // validations, 1), patience=0, valid_max_sentences=100,
                log_every=max(steps // 10, 1), progress=False)
    return TrainConfig(**{**base, **kw})


POSTECH_SCALES: dict[str, PostechScale] = {
    "smoke": PostechScale(
        "smoke", _steps(6, max_tokens=1024, valid_max_sentences=8), _steps(4, max_tokens=1024, valid_max_sentences=8),
        seeds=(0, 1), synthetic_per_source=200, dev_examples=12, test_examples=24, top_n=(2,), n_bootstrap=100,
        notes="CI only: checks that the chapter runs end to end; its numbers mean nothing."),
    # Early stopping on 500 dev triplets: at 150 generic and 60 fine-tuning updates (4 validations on 100 triplets,
    # no patience) every run was still rising, so no claim could pass the verdict protocol's convergence rule.
    # Measured on 2 CPU threads, `small` preset, 1,536 tokens: 0.72 s per update at alpha = 1, 1.55 s at alpha =
    # 0.8 (the incremental pass), at most 13 s to decode the 1,000 dev triplets greedily (an untrained model's time,
    # which decodes to its length limit: an upper bound).
    "small": PostechScale(
        "small", _steps(2000, validations=8, patience=2, lr=5e-4, valid_max_sentences=500, **CPU_BOOK_SETTING),
        _steps(800, validations=8, patience=2, lr=3e-4, valid_max_sentences=500, **CPU_BOOK_SETTING),
        synthetic_per_source=6000, dev_examples=300,
        test_examples=1000,
        notes="bf16 autocast (on a CPU with the math attention kernel): the shared `small` denoiser (the `small` "
              "preset) initialises every system; at most 2,000 generic updates per architecture and 800 "
              "fine-tuning updates per teacher-forcing ratio (alpha in {1.0, 0.8}), each early-stopped on 500 dev "
              "triplets (patience 2 of 8 validations), greedy decoding; Table 2 on the first 300 dev triplets, "
              "Table 4 on the whole test split."),
    "full": PostechScale(
        "full", _steps(4000, validations=16, patience=4, max_tokens=4096, lr=3e-4, valid_max_sentences=300),
        _steps(1000, validations=8, patience=3, max_tokens=4096, lr=1e-4, valid_max_sentences=300),
        ratios=(1.0, 0.95, 0.9, 0.85, 0.8),
        beam_size=5, top_n=(4, 6, 8),
        notes="One GPU: the shared denoiser at `full`, the paper's five ratios, beam 5, every dev and test triplet."),
}


# ---- Table 1: the eSCAPE stand-in ------------------------------------------------------------------------

def german_lexicon(sentences: list[str], size: int = 2000) -> list[str]:
    """The `size` most frequent words of a German column: the substitutions of the synthetic MT."""
    counts = Counter(w for s in sentences for w in s.split())
    return [w for w, _ in counts.most_common(size)]


def synthetic_mt(corpus: Corpus, seed: int, max_error_rate: float, limit: int = 0) -> Corpus:
    """(src, mt', pe) from parallel (src -> pe): mt' = pe with word errors at a rate drawn per sentence
    uniformly from [0, max_error_rate] (`noisy_copy`); the first `limit` pairs (0 = all).

    # Deviation: eSCAPE's MT is a real system's output; ours is error injection (notes C.4's fallback), because
    # the MT models we can train on CPU do not translate the IT domain sensibly (see the chapter)."""
    if limit:
        corpus = corpus.subset(range(min(limit, len(corpus))))
    rng = random.Random(f"escape:{seed}:{corpus.name}")
    lexicon = german_lexicon(corpus.target)
    mt = [noisy_copy(pe, rng, lexicon, rng.uniform(0.0, max_error_rate)) for pe in corpus.target]
    return Corpus(f"synthetic ({corpus.name})", "train", ("en", "de"), "de", [list(corpus.sources[0]), mt],
                  list(corpus.target))


def sentence_ter(hyps: list[str], refs: list[str]) -> list[float]:
    """Per-sentence TER (cased, sacreBLEU), in %."""
    metric = TER(**TER_CASED)
    return [metric.sentence_score(h, [r]).score for h, r in zip(hyps, refs)]


@dataclass
class FilterRule:
    """The paper's eSCAPE filter (§3.1): at most 70 words, TER(mt, pe) <= 75, length ratio of mt and pe < 1.4."""

    max_words: int = 70
    max_ter: float = 75.0
    max_length_ratio: float = 1.4

    def keeps(self, src: str, mt: str, pe: str, ter: float) -> bool:
        lengths = [len(s.split()) for s in (src, mt, pe)]
        if max(lengths) > self.max_words or min(lengths[1:]) == 0:
            return False
        ratio = max(lengths[1], lengths[2]) / min(lengths[1], lengths[2])  # "reciprocal length ratio"
        return ter <= self.max_ter and ratio < self.max_length_ratio


def escape_filter(corpus: Corpus, rule: FilterRule = FilterRule()) -> Corpus:
    """The triplets of `corpus` that pass `rule`."""
    ters = sentence_ter(corpus.sources[1], corpus.target)
    keep = [i for i, (s, m, p, t) in enumerate(zip(*corpus.sources, corpus.target, ters)) if rule.keeps(s, m, p, t)]
    return corpus.subset(keep)


def concat_corpora(parts: list[Corpus], name: str) -> Corpus:
    """Several (src, mt) -> pe corpora as one."""
    return Corpus(name, "train", ("en", "de"), "de", [[s for c in parts for s in c.sources[k]] for k in range(2)],
                  [t for c in parts for t in c.target])


def parallel_corpora(tasks: dict[str, TranslationData], synthetic: bool) -> list[Corpus]:
    """The en->de parallel text the synthetic triplets are made from: APE-train (src, pe) and Multi30k en->de
    (only the APE stand-in when the toy tasks stand in for the real data)."""
    ape = tasks["ape"].corpora["train"]
    parts = [Corpus("APE train (src, pe)", "train", ("en",), "de", [ape.sources[0]], ape.target)]
    if not synthetic:
        m30k = load_multi30k("train", sources=("en",), target="de")
        parts.append(Corpus("Multi30k en-de", "train", ("en",), "de", m30k.sources, m30k.target))
    return parts


def upsample(encoded: EncodedCorpus, times: int) -> EncodedCorpus:
    return EncodedCorpus([col * times for col in encoded.sources], encoded.target * times, encoded.target_prefix,
                         encoded.eos_id)


def join_encoded(parts: list[EncodedCorpus]) -> EncodedCorpus:
    return EncodedCorpus([[x for p in parts for x in p.sources[k]] for k in range(len(parts[0].sources))],
                         [x for p in parts for x in p.target], parts[0].target_prefix, parts[0].eos_id)


def official_times(n_official: int, n_synthetic: int, share: float) -> int:
    """How many copies of the official triplets make them about `share` of the generic data (at least 1)."""
    if not 0.0 < share < 1.0:
        raise MsgcoreError(f"official_share = {share!r} must be in (0, 1)")
    return max(1, round(share / (1 - share) * n_synthetic / max(n_official, 1)))


# ---- the chapter's state --------------------------------------------------------------------------------

@dataclass
class Chapter:
    scale: PostechScale
    scale_name: str
    denoiser: Denoiser
    device: torch.device
    out_dir: Path
    seed: int = 0
    synthetic_raw: Corpus | None = None  # the eSCAPE stand-in before the filter
    synthetic: Corpus | None = None  # ... and after it
    generic_data: EncodedCorpus | None = None
    runs: dict = field(default_factory=dict)  # (system, alpha or GENERIC, seed) -> RunResult
    outputs: dict = field(default_factory=dict)  # (system name, split) -> hypotheses

    @property
    def ape(self) -> TranslationData:
        return self.denoiser.tasks.tasks["ape"]

    @property
    def tokenizer(self):
        return self.denoiser.tokenizer


class TokenizedTextAdvice(logging.Filter):
    """Drops sacreBLEU's advice to detokenize. The APE data is tokenized, as the shared task distributes it, and
    the shared task scores APE (TER, BLEU) on that tokenized text, so the advice does not apply to this chapter."""
    ADVICE = ("tokenized period", "forgot to detokenize", "suppress this message with the `force` parameter")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(advice in record.getMessage() for advice in self.ADVICE)


TOKENIZED_TEXT_ADVICE = TokenizedTextAdvice()


def check_options(scale_name: str, seed: int) -> PostechScale:
    """The scale, or a one-line error before any work."""
    scale = get_scale(POSTECH_SCALES, scale_name)
    if not isinstance(seed, int) or seed < 0:
        raise MsgcoreError(f"seed = {seed!r}; use an integer >= 0")
    if not scale.ratios or scale.ratios[0] != 1.0 or any(not 0.0 <= r <= 1.0 for r in scale.ratios):
        raise MsgcoreError(f"ratios = {scale.ratios!r}: the first must be 1.0 and all in [0, 1]")
    return scale


def start_chapter(scale_name: str, device: torch.device, out_dir: str | Path, seed: int = 0) -> Chapter:
    """The shared cached denoiser, the APE task in its layout, and the filtered synthetic triplets."""
    scale = check_options(scale_name, seed)
    logging.getLogger("sacrebleu").addFilter(TOKENIZED_TEXT_ADVICE)  # adding it twice keeps one copy
    denoiser = pretrained_denoiser(scale.denoiser_scale, device, seed, Path(out_dir) / "denoiser")
    ch = Chapter(scale, scale_name, denoiser, device, Path(out_dir), seed)
    parts = [synthetic_mt(c, seed, scale.max_error_rate, scale.synthetic_per_source)
             for c in parallel_corpora(denoiser.tasks.tasks, denoiser.tasks.synthetic)]
    ch.synthetic_raw = concat_corpora(parts, "eSCAPE stand-in")
    ch.synthetic = escape_filter(ch.synthetic_raw)
    official = ch.ape.encoded["train"]
    synthetic = encode_task(ch.synthetic, ch.tokenizer, max_len=128)
    times = official_times(len(official), len(synthetic), scale.official_share)
    ch.generic_data = join_encoded([synthetic, upsample(official, times)])
    return ch


# ---- training ------------------------------------------------------------------------------------------

def postech_config(ch: Chapter, **fields) -> PostechConfig:
    """The denoiser's dimensions with POSTECH's fields. # Deviation: pre-norm and the embedding LayerNorm, as the
    pre-trained model has them (the paper's equations are post-norm; its toolkit, OpenNMT-py, is pre-norm)."""
    base = {k: v for k, v in ch.denoiser.model.cfg.to_dict().items() if k in TransformerConfig.__dataclass_fields__}
    return PostechConfig(**{**base, "pre_norm": True, "embedding_norm": True,
                            "teacher_forcing_pass": ch.scale.teacher_forcing_pass, **fields})


def train_generic(ch: Chapter, system: str, fields: dict) -> RunResult:
    """Phase 1: the denoiser turned into a POSTECH model, trained on the generic data (seed = the chapter's)."""
    torch.manual_seed(ch.seed)
    model = from_pretrained(ch.denoiser.model, postech_config(ch, **fields))
    return train_model(model, ch.ape, replace(ch.scale.generic, seed=ch.seed), ch.device,
                       ch.out_dir / slug(system) / "generic", train=ch.generic_data)


def finetune(ch: Chapter, generic: RunResult, system: str, fields: dict, alpha: float, seed: int) -> RunResult:
    """Phase 2: the generic model fine-tuned on the official triplets with teacher-forcing ratio alpha (§3.2)."""
    model = PostechAPE(postech_config(ch, **fields, teacher_forcing_ratio=alpha))
    model.load_state_dict(generic.model.state_dict())
    return train_model(model, ch.ape, replace(ch.scale.finetune, seed=seed), ch.device,
                       ch.out_dir / slug(system) / f"alpha-{alpha:g}-seed-{seed}")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def concat_model(ch: Chapter) -> TriceTransformer:
    """The concatenation baseline: the denoiser reading "src </s> <en> mt </s> <de>" with one encoder and one
    cross-attention (chapter 1's DualBART; the 2018 systems' single-encoder input)."""
    cfg = replace(ch.denoiser.model.cfg, **ONE_LONG_SEQUENCE)
    return from_single_source(ch.denoiser.model, cfg)


def train_concat(ch: Chapter, seed: int) -> tuple[RunResult, RunResult]:
    """The concatenation baseline through the same two phases (generic, then fine-tuned at alpha = 1)."""
    torch.manual_seed(ch.seed)
    generic = train_model(concat_model(ch), ch.ape, replace(ch.scale.generic, seed=ch.seed), ch.device,
                          ch.out_dir / "concat" / "generic", train=ch.generic_data)
    model = concat_model(ch)
    model.load_state_dict(generic.model.state_dict())
    tuned = train_model(model, ch.ape, replace(ch.scale.finetune, seed=seed), ch.device,
                        ch.out_dir / "concat" / f"seed-{seed}")
    return generic, tuned


def sweep_runs(ch: Chapter) -> None:
    """Table 2: each architecture's generic model and one fine-tuning run per ratio (the first seed)."""
    for system, fields in ARCHITECTURES.items():
        sweep_system(ch, system, fields)


def sweep_system(ch: Chapter, system: str, fields: dict) -> None:
    """One architecture's generic model and its fine-tuning at every ratio (the first seed)."""
    generic = generic_run(ch, system, fields)
    for alpha in ch.scale.ratios:
        if (system, alpha, ch.seed) not in ch.runs:
            ch.runs[system, alpha, ch.seed] = finetune(ch, generic, system, fields, alpha, ch.seed)


def generic_run(ch: Chapter, system: str, fields: dict) -> RunResult:
    """An architecture's generic model, trained once (the first seed) and kept in `ch.runs`."""
    if (system, GENERIC, ch.seed) not in ch.runs:
        ch.runs[system, GENERIC, ch.seed] = train_generic(ch, system, fields)
    return ch.runs[system, GENERIC, ch.seed]


def control_runs(ch: Chapter) -> None:
    """The dual-source control and its joint-encoder twin (P7) on every seed, and the concatenation baseline,
    alpha = 1: P7 pairs the twin's seed k with the control's seed k."""
    for s in seeds(ch):
        control_seed(ch, s)
    if (CONCAT, 1.0, ch.seed) not in ch.runs:
        ch.runs[CONCAT, GENERIC, ch.seed], ch.runs[CONCAT, 1.0, ch.seed] = train_concat(ch, ch.seed)


def control_seed(ch: Chapter, seed: int) -> None:
    """The dual-source control and its joint-encoder twin fine-tuned at alpha = 1 on one seed (their generic models
    are the first seed's, shared)."""
    for system, fields in ((DUAL, CONTROLS[DUAL]), (JOINT_SEQ_ARCHITECTURE, ARCHITECTURES[JOINT_SEQ_ARCHITECTURE])):
        if (system, 1.0, seed) not in ch.runs:
            ch.runs[system, 1.0, seed] = finetune(ch, generic_run(ch, system, fields), system, fields, 1.0, seed)


def seeds(ch: Chapter) -> tuple[int, ...]:
    return tuple(ch.seed + s for s in ch.scale.seeds)


def best_single(ch: Chapter, metric: str = "TER") -> tuple[str, float]:
    """(architecture, alpha) of the fine-tuned model with the best dev `metric` (the first seed): the lowest TER,
    the highest BLEU."""
    table, sign = dev_table(ch), (-1 if metric == "TER" else 1)
    tuned = [(system, alpha) for system in ARCHITECTURES for alpha in ch.scale.ratios]
    return max(tuned, key=lambda key: sign * table[key][metric])


def best_seed_runs(ch: Chapter, part: tuple[int, int] = (0, 1)) -> None:
    """The best single system (by dev TER) on the other seeds (with `part` = (i, N), every N-th of them from the
    i-th)."""
    system, alpha = best_single(ch)
    for s in seeds(ch)[1:][part[0]::part[1]]:
        if (system, alpha, s) not in ch.runs:
            ch.runs[system, alpha, s] = finetune(ch, ch.runs[system, GENERIC, ch.seed], system,
                                                 ARCHITECTURES[system], alpha, s)


def share_jobs(ch: Chapter) -> list[Callable[[], None]]:
    """The chapter's runs as jobs that processes side by side can share (`run_chapter`'s `part`): each
    architecture's sweep, each seed of the controls, the concatenation baseline. A job that needs a run another
    process is training waits for it (msgcore.runcache's lock); the keys are `run_chapter`'s own."""
    jobs = [partial(sweep_system, ch, system, fields) for system, fields in ARCHITECTURES.items()]
    jobs += [partial(control_seed, ch, s) for s in seeds(ch)]
    return jobs + [partial(train_concat, ch, ch.seed)]


def run_chapter(scale_name: str, device: torch.device, out_dir: str | Path, seed: int = 0,
                part: tuple[int, int] = (0, 1)) -> Chapter:
    """Every training run of chapter 4, through the run cache (`python -m msgcore.experiments ch04`). With `part` =
    (i, N), N processes side by side: process i takes every N-th job of `share_jobs` and of the best system's extra
    seeds (after the whole sweep, which it awaits); process 0 then makes the full pass, finding the runs in the
    cache, so that what it returns is the whole chapter."""
    ch = start_chapter(scale_name, device, out_dir, seed)
    if part != (0, 1):
        for job in share_jobs(ch)[part[0]::part[1]]:
            job()
        sweep_runs(ch)  # the best system needs every architecture's sweep: trained by now, or awaited
        best_seed_runs(ch, part)
        if part[0] != 0:
            return ch
    sweep_runs(ch)
    control_runs(ch)
    best_seed_runs(ch)
    return ch


CHAPTER1_RESULTS = Path("results") / "ch01_trice.json"  # relative to the book folder
CHAPTER1_TRICE = "TRICE (APE)"  # chapter 1's TRICE on the APE test split this chapter also uses
CHAPTER1_TEST = "APE test"  # chapter 1's name of that split
CHAPTER1_METRICS = {"TER": "TER", "TER (uncased)": "TER (ci)", "BLEU": "BLEU"}  # chapter 1's names -> this chapter's


def chapter1_trice(path: str | Path = CHAPTER1_RESULTS) -> dict | None:
    """Chapter 1's TRICE on the same APE test split, from the same denoiser, as chapter 1's results file reports it:
    {"scores": {metric: values in seed order}, "scale", "commit", "updates", "stale": why the file is not current},
    with this chapter's metric names; None when chapter 1 has not written its results. Read as data: this chapter
    neither trains nor loads chapter 1's model."""
    system = read_system(path, CHAPTER1_TRICE)
    scores = (system or {}).get("scores", {}).get(CHAPTER1_TEST)
    if not scores:
        return None
    return {"scores": {ours: scores[theirs] for theirs, ours in CHAPTER1_METRICS.items() if theirs in scores},
            "scale": system["scale"], "commit": system["commit"], "updates": system.get("updates"),
            "stale": list(system.get("stale", []))}


def chapter1_label(trice: dict) -> str:
    """How every table and line names chapter 1's figure: its scale, and STALE with every reason when chapter 1's
    results are not current in this checkout (a stale figure is never passed for a current one)."""
    stale = f"; STALE: {'; '.join(trice['stale'])}" if trice["stale"] else ""
    return f"TRICE (chapter 1 at {trice['scale']}, same split{stale})"


# ---- decoding and scores --------------------------------------------------------------------------------

def split_limit(ch: Chapter, split: str) -> int:
    n = ch.scale.dev_examples if split == "val" else ch.scale.test_examples
    return min(n or len(ch.ape.corpora[split]), len(ch.ape.corpora[split]))


def references(ch: Chapter, split: str) -> list[str]:
    return list(ch.ape.corpora[split].target[:split_limit(ch, split)])


def mt_outputs(ch: Chapter, split: str) -> list[str]:
    """The do-nothing baseline on a split: the MT, unchanged."""
    return do_nothing(ch.ape.corpora[split])[:split_limit(ch, split)]


def decode(ch: Chapter, name: str, model, split: str) -> list[str]:
    """A model's (or an Ensemble's) outputs on the first scored triplets of a split, computed once."""
    if (name, split) not in ch.outputs:
        ch.outputs[name, split] = translate_encoded(model, ch.tokenizer, ch.ape.encoded[split], ch.device,
                                                    GenerationConfig(beam_size=ch.scale.beam_size),
                                                    limit=split_limit(ch, split))
    return ch.outputs[name, split]


def run_name(system: str, alpha, seed: int) -> str:
    tag = GENERIC if alpha == GENERIC else f"α={alpha:g}"
    return f"{system} ({tag}, seed {seed})"


def run_outputs(ch: Chapter, key: tuple, split: str) -> list[str]:
    return decode(ch, run_name(*key), ch.runs[key].model, split)


def ape_scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """TER cased (the official tercom setting), TER case-insensitive (sacreBLEU's default), BLEU (cased, 13a)."""
    return {"TER": corpus_score("ter", hyps, refs, **TER_CASED).score,
            "TER (ci)": corpus_score("ter", hyps, refs).score, "BLEU": corpus_score("bleu", hyps, refs).score}


def dev_table(ch: Chapter) -> dict[tuple, dict[str, float]]:
    """(system, alpha or GENERIC) -> dev scores of the first seed, for the four architectures."""
    refs = references(ch, "val")
    return {(system, alpha): ape_scores(run_outputs(ch, (system, alpha, ch.seed), "val"), refs)
            for system in ARCHITECTURES for alpha in (GENERIC, *ch.scale.ratios)}


INITIAL_OUTPUTS = "initialisation (the denoiser copying mt)"
CONCAT_START_OUTPUTS = "initialisation of the concatenation baseline (the denoiser reading src and mt)"


def initial_outputs(ch: Chapter, split: str) -> list[str]:
    """Where every POSTECH system and the dual-source control start: the denoiser reading mt alone (what
    `from_pretrained` gives at step 0, for every architecture)."""
    if (INITIAL_OUTPUTS, split) not in ch.outputs:
        model = from_pretrained(ch.denoiser.model, postech_config(ch, **ARCHITECTURES["Seq w/o mask"]))
        decode(ch, INITIAL_OUTPUTS, model.to(ch.device).eval(), split)
    return ch.outputs[INITIAL_OUTPUTS, split]


def concat_start_outputs(ch: Chapter, split: str) -> list[str]:
    """Where the concatenation baseline starts: the denoiser reading "src </s> <en> mt", before any update."""
    if (CONCAT_START_OUTPUTS, split) not in ch.outputs:
        decode(ch, CONCAT_START_OUTPUTS, concat_model(ch).to(ch.device).eval(), split)
    return ch.outputs[CONCAT_START_OUTPUTS, split]


# ---- Table 1 -----------------------------------------------------------------------------------------

def data_table(ch: Chapter) -> list[dict]:
    """Table 1's analogue: triplets and do-nothing TER (cased) of every set, with the paper's rows beside."""
    rows = [(f"APE {split}", ch.ape.corpora[split]) for split in ("train", "val", "test")]
    if not ch.denoiser.tasks.synthetic:
        rows += [(f"MLQE-PE en-de {split}", load_mlqe_pe(split)) for split in ("train", "dev")]
    rows += [("eSCAPE stand-in", ch.synthetic_raw), ("eSCAPE stand-in, filtered", ch.synthetic)]
    out = []
    for name, corpus in rows:
        mt = do_nothing(corpus)
        out.append({"dataset": name, "triplets": len(corpus),
                    "TER": corpus_score("ter", mt, list(corpus.target), **TER_CASED).score,
                    "mt == pe (%)": 100 * sum(m == p for m, p in zip(mt, corpus.target)) / max(len(corpus), 1)})
    return out


# ---- Table 3: ensembles chosen on dev ----------------------------------------------------------------

def ensemble_sets(dev: dict[tuple, dict[str, float]], ratios, top_n) -> dict[str, list[tuple]]:
    """The paper's three rules (§3.2) over the fine-tuned models, by dev scores (ties: the first listed):
    Ens_set_1-topN   the N best by TER of all;   Ens_set_2-topN  the N best by TER per architecture;
    Ens_set_3        per architecture the best by TER and the best by BLEU (one model when they coincide)."""
    tuned = [(system, alpha) for system in ARCHITECTURES for alpha in ratios]
    by_ter = sorted(tuned, key=lambda k: dev[k]["TER"])
    sets = {f"Ens_set_1-top{n}": by_ter[:n] for n in top_n if n <= len(tuned)}
    for n in (1, 2):
        if n <= len(ratios):
            sets[f"Ens_set_2-top{n}"] = [k for system in ARCHITECTURES
                                         for k in sorted([k for k in tuned if k[0] == system],
                                                         key=lambda k: dev[k]["TER"])[:n]]
    var2 = []
    for system in ARCHITECTURES:
        mine = [k for k in tuned if k[0] == system]
        for best in (min(mine, key=lambda k: dev[k]["TER"]), max(mine, key=lambda k: dev[k]["BLEU"])):
            if best not in var2:
                var2.append(best)
    sets["Ens_set_3"] = var2
    return sets


def ensemble_outputs(ch: Chapter, name: str, members: list[tuple], split: str) -> list[str]:
    """The outputs of the ensemble of the first seed's fine-tuned models `members`, decoded once."""
    if (name, split) not in ch.outputs:
        decode(ch, name, Ensemble([ch.runs[(system, alpha, ch.seed)].model for system, alpha in members]).eval(),
               split)
    return ch.outputs[name, split]


# ---- analyses ------------------------------------------------------------------------------------------

BUCKETS = ((0.0, 0.0, "TER = 0 (perfect MT)"), (0.0, 20.0, "0 < TER ≤ 20"), (20.0, 40.0, "20 < TER ≤ 40"),
           (40.0, float("inf"), "TER > 40"))


def bucket_of(ter: float) -> str:
    """The MT-quality bucket of a sentence by its MT's TER against the post-edit."""
    if ter < 0:
        raise MsgcoreError(f"TER {ter!r} is negative")
    for low, high, name in BUCKETS:
        if (ter == 0.0 and high == 0.0) or (low < ter <= high):
            return name
    raise AssertionError("unreachable")


def bucket_table(mt: list[str], refs: list[str], systems: dict[str, list[str]]) -> list[dict]:
    """Corpus TER (cased) per MT-quality bucket for do-nothing and each system."""
    buckets = [bucket_of(t) for t in sentence_ter(mt, refs)]
    rows = []
    for _, _, name in BUCKETS:
        idx = [i for i, b in enumerate(buckets) if b == name]
        if not idx:
            continue
        row = {"MT quality": name, "sentences": len(idx)}
        for system, hyps in {DO_NOTHING: mt, **systems}.items():
            row[system] = corpus_score("ter", [hyps[i] for i in idx], [refs[i] for i in idx], **TER_CASED).score
        rows.append(row)
    return rows


def untouched(hyps: list[str], mt: list[str]) -> float:
    """% of outputs identical to the MT."""
    return 100 * sum(h == m for h, m in zip(hyps, mt)) / max(len(mt), 1)


def heatmap_example(ch: Chapter, model: PostechAPE, max_pieces: int = 14) -> tuple[list[str], list[str], Tensor]:
    """The shortest-ish test triplet's mt->src attention in the top joint-encoder layer, averaged over heads:
    (src pieces, mt pieces, weights (T_y, T_x))."""
    enc = ch.ape.encoded["test"]
    n = split_limit(ch, "test")
    i = min(range(n), key=lambda j: abs(len(enc.sources[1][j]) - max_pieces))
    src, mt = (torch.tensor([enc.sources[k][i]], device=ch.device) for k in range(2))
    masks = [torch.ones_like(src, dtype=torch.bool), torch.ones_like(mt, dtype=torch.bool)]
    with torch.no_grad():
        weights = model.eval().stack_attention([src, mt], masks)[-1][0].mean(0).float().cpu()  # (T_y, T_x)
    pieces = [[ch.tokenizer.id_to_piece(t) for t in enc.sources[k][i]] for k in range(2)]
    return pieces[0], pieces[1], weights


def case_studies(src: list[str], mt: list[str], refs: list[str], hyps: list[str], max_words: int = 30) -> list[dict]:
    """Among the edited sentences of at most `max_words` words whose MT is not beyond repair (TER <= 100), the one
    with the largest TER gain and the one with the largest loss."""
    before, after = sentence_ter(mt, refs), sentence_ter(hyps, refs)
    edited = [i for i in range(len(mt)) if hyps[i] != mt[i] and before[i] <= 100 and len(refs[i].split()) <= max_words]
    if not edited:
        return []
    picks = {"largest gain": min(edited, key=lambda i: after[i] - before[i]),
             "largest loss": max(edited, key=lambda i: after[i] - before[i])}
    return [{"case": case, "src": src[i], "mt": mt[i], "APE output": hyps[i], "pe": refs[i],
             "TER mt": before[i], "TER output": after[i]} for case, i in picks.items()]


def loss_ratio(run: RunResult) -> float:
    """Last logged training loss / first: below 1 when the run learned."""
    losses = [r["loss"] for r in run.history if r["kind"] == "train"]
    return losses[-1] / losses[0] if len(losses) > 1 else 1.0


# ---- the paper's numbers (Lee, Shin, Lee 2019, read from the paper's text; /work/shared/papers) ---------

PAPER_TABLES = {
    # Table 1: triplets and TER of mt vs pe.
    "table1": {"official training set": (13442, 14.89), "official development set": (1000, 15.08),
               "eSCAPE-NMT": (7258533, 60.54), "eSCAPE-NMT-filtered": (4303876, 39.65)},
    # Table 2 (WMT19 dev): (TER, BLEU) per architecture and teacher-forcing ratio; "w/o tuning" = generic.
    "table2": {
        "Par w/ mask": {GENERIC: (15.06, 77.18), 1.0: (15.02, 77.25), 0.95: (15.07, 77.24), 0.9: (14.75, 77.54),
                        0.85: (14.86, 77.37), 0.8: (14.98, 77.06)},
        "Par w/o mask": {GENERIC: (15.03, 77.29), 1.0: (14.95, 77.41), 0.95: (14.94, 77.24), 0.9: (14.94, 77.26),
                         0.85: (14.95, 77.30), 0.8: (14.93, 77.15)},
        "Seq w/ mask": {GENERIC: (14.89, 77.38), 1.0: (14.83, 77.54), 0.95: (14.83, 77.41), 0.9: (14.79, 77.40),
                        0.85: (14.73, 77.50), 0.8: (14.83, 77.44)},
        "Seq w/o mask": {GENERIC: (15.10, 77.19), 1.0: (14.75, 77.68), 0.95: (14.53, 77.36), 0.9: (14.99, 77.26),
                         0.85: (14.76, 77.56), 0.8: (15.34, 76.79)}},
    # Table 3 (dev): ensembles, (TER, BLEU).
    "table3": {"Ens_set_1-top4": (14.66, 77.79), "Ens_set_1-top6": (14.62, 77.79), "Ens_set_1-top8": (14.62, 77.81),
               "Ens_set_2-top1": (14.58, 77.86), "Ens_set_2-top2": (14.55, 77.95), "Ens_set_3": (14.61, 77.86)},
    # Table 4 (WMT19 test), (TER, BLEU); the baseline is the do-nothing MT.
    "table4": {"POSTECH_Primary (top2Ens8)": (16.11, 76.22), "POSTECH_Contrastive (var2Ens8)": (16.13, 76.21),
               "POSTECH_Contrastive (top1Ens4)": (16.17, 76.15), "Tebbifakhr et al. (2018)": (16.46, 75.53),
               "Junczys-Dowmunt and Grundkiewicz (2018)": (16.50, 75.44), "Shin and Lee (2018)": (16.70, 75.14),
               "Baseline": (16.84, 74.73)},
}
PAPER_SETTINGS = ("WMT19 En-De APE (NMT output): 13,442 training and 1,000 dev triplets, plus eSCAPE-NMT filtered to "
                  "4.3M; base Transformer (d=512, 6 layers), 32k shared SentencePiece, OpenNMT-py, phase 1 on "
                  "eSCAPE + official x20, phase 2 on the official data with alpha in {1.00, ..., 0.80}")


# ---- the claims, declared before the runs, and the evidence they are judged on (msgcore.verdicts) ------

TEST, DEV, DEV_HELD_OUT = "test", "dev", "dev, second half"  # the scored sets, as the claims name them
BEST = "POSTECH best single (chosen on dev TER)"
BEST_BLEU = "POSTECH best single (chosen on dev BLEU)"  # the paper's single model beside its ensemble (P5)
ENSEMBLE = "POSTECH ensemble (chosen on dev TER)"
JOINT_SEQ_ARCHITECTURE = "Seq w/o mask"  # the joint-encoder twin of the dual-source control (P7)
JOINT_SEQ = f"{JOINT_SEQ_ARCHITECTURE}, α = 1"
TUNED = "fine-tuned, α = 1 (each architecture)"
TUNED_BELOW_1 = "fine-tuned, best α < 1 (each architecture)"
GENERIC_EACH = "generic model (each architecture)"
SEQUENTIAL = "sequential decoder (best of its models on dev)"
PARALLEL = "parallel decoder (best of its models on dev)"
MASKED = "with the future mask (best α, each decoder)"
UNMASKED = "without the future mask (best α, each decoder)"
FILTERED, UNFILTERED = "eSCAPE stand-in, filtered", "eSCAPE stand-in"
CONSTANT = "best constant output"
INITIAL = "untrained start (the denoiser reading mt)"
CLAIM_METRICS = {"TER": ("ter", TER_CASED), "BLEU": ("bleu", {})}  # label -> (sacreBLEU metric, its options)
START_MARGIN = 0.2  # dev TER the start may lose to do-nothing: about a quarter of the paper's whole effect (−0.73)
GENERIC_GAIN = 0.01  # dev TER: "beats its start" is a gain that sacreBLEU's two decimals show
GATE_START = f"the APE start (the denoiser copying mt) is within {START_MARGIN:g} dev TER of do-nothing " \
             f"(start − do-nothing)"
GATE_GENERIC = "every generic model beats its own start on dev TER (the least gain, start − generic)"
GATES = (GATE_START, GATE_GENERIC)  # every APE claim rests on both
MASK_MARGIN = 0.25  # TER: about the paper's own mask differences (−0.18 with the parallel decoder, +0.20 sequential)
TER_CONSTANT_CANDIDATES = 50  # TER is slow: the best constant output is chosen among the first 50 references
DECODERS = {"parallel": ("Par w/ mask", "Par w/o mask"), "sequential": ("Seq w/ mask", "Seq w/o mask")}
VALIDATED_ON = "; every stage validates on dev BLEU"  # the trainer's dev metric, said beside each TER claim


def mean_label(models: int) -> str:
    """The metric label of a pooled system (several architectures' models, one seed): their mean cased TER."""
    return f"TER, mean of {models} models"


ARCHITECTURES_TER, DECODERS_TER = mean_label(len(ARCHITECTURES)), mean_label(len(DECODERS))


def paper_dev_ter(alpha) -> float:
    """Table 2: the mean dev TER of the paper's four architectures at `alpha` (GENERIC: the generic models)."""
    return statistics.fmean(cells[alpha][0] for cells in PAPER_TABLES["table2"].values())


def declared_claims(scale_name: str) -> list[verdicts.Claim]:
    """Chapter 4's claims (the paper's figures quoted), the same at every scale. TER is cased, lower is better;
    every generation claim names its floors (do-nothing, the best constant output and, on dev, the untrained start)
    and rests on both gates. Each "better" claim gives the paper's own baseline, so that its smallest effect m is
    half the paper's delta at our level. The comparisons over architectures (P1, P2, O2) compare the mean TER of
    the four architectures (or the two decoders), one model each on the chapter's seed, as the paper's own
    evidence does: one seed, so "indicative" at most."""
    get_scale(POSTECH_SCALES, scale_name)
    test_floors, dev_floors = (DO_NOTHING, CONSTANT), (DO_NOTHING, CONSTANT, INITIAL)
    ter = {"metric": "TER", "higher_is_better": False, "gates": GATES}
    architectures_ter, decoders_ter = {**ter, "metric": ARCHITECTURES_TER}, {**ter, "metric": DECODERS_TER}
    table4 = PAPER_TABLES["table4"]
    return [
        verdicts.Claim("P6a", f"POSTECH's best single model beats doing nothing (test TER{VALIDATED_ON})",
                       "primary 16.11 vs baseline 16.84 TER, WMT19 test (−0.73)", "better", BEST, test_set=TEST,
                       baseline=DO_NOTHING, paper_delta=-0.73, paper_baseline=table4["Baseline"][0],
                       floors=test_floors, **ter),
        verdicts.Claim("P6a-ens", f"POSTECH's ensemble beats doing nothing (test TER{VALIDATED_ON})",
                       "primary 16.11 vs baseline 16.84 TER, WMT19 test (−0.73)", "better", ENSEMBLE, test_set=TEST,
                       baseline=DO_NOTHING, paper_delta=-0.73, paper_baseline=table4["Baseline"][0],
                       floors=test_floors, **ter),
        verdicts.Claim("P6b", f"POSTECH's ensemble beats the previous round's best, a concatenation model (test "
                       f"TER{VALIDATED_ON})", "16.11 vs Tebbifakhr et al. (2018) 16.46 TER (−0.35)", "better",
                       ENSEMBLE, test_set=TEST, baseline=CONCAT, paper_delta=-0.35,
                       paper_baseline=table4["Tebbifakhr et al. (2018)"][0], floors=test_floors, **ter),
        verdicts.Claim("P7", f"the joint encoder beats separate encoders: Seq w/o mask vs the dual-source control, "
                       f"α = 1, the same training, seed by seed (test TER{VALIDATED_ON})",
                       "16.11 vs Junczys-Dowmunt and Grundkiewicz (2018) 16.50 TER (−0.39, not a controlled "
                       "comparison)", "better", JOINT_SEQ, test_set=TEST, baseline=DUAL, paper_delta=-0.39,
                       paper_baseline=table4["Junczys-Dowmunt and Grundkiewicz (2018)"][0], floors=test_floors,
                       **ter),
        verdicts.Claim("P1", f"adjusting the teacher-forcing ratio helps: the best α < 1 (chosen on the first half "
                       f"of dev) vs α = 1, mean over the architectures (TER on the second half of dev{VALIDATED_ON})",
                       "−0.27, −0.02, −0.10, −0.22 TER, dev (mean −0.15 on α = 1's mean 14.89; α chosen on the set "
                       "it reports)", "better", TUNED_BELOW_1, test_set=DEV_HELD_OUT, baseline=TUNED,
                       paper_delta=-0.1525, paper_baseline=paper_dev_ter(1.0), floors=dev_floors,
                       **architectures_ter),
        verdicts.Claim("P2", f"fine-tuning on the official triplets (α = 1) improves on the generic model, mean over "
                       f"the architectures (dev TER{VALIDATED_ON})",
                       "−0.04, −0.08, −0.06, −0.35 TER, dev (mean −0.13 on the generic models' mean 15.02)", "better",
                       TUNED, test_set=DEV, baseline=GENERIC_EACH, paper_delta=-0.1325,
                       paper_baseline=paper_dev_ter(GENERIC), floors=dev_floors, **architectures_ter),
        verdicts.Claim("P5-dev", f"the ensemble beats the best single model (by dev BLEU, as the paper's) in BLEU "
                       f"(dev, where the paper measured it{VALIDATED_ON})",
                       "77.95 vs 77.68 BLEU, dev (+0.27: Ens_set_2-top2 vs Seq w/o mask, α = 1)", "better", ENSEMBLE,
                       "BLEU", DEV, baseline=BEST_BLEU, paper_delta=0.27, paper_baseline=77.68, floors=dev_floors,
                       gates=GATES),
        verdicts.Claim("P5-test", f"the ensemble beats the best single model (by dev BLEU, as the paper's) in BLEU "
                       f"(test{VALIDATED_ON})",
                       "77.95 vs 77.68 BLEU, dev (+0.27; no test figure for the single model)", "better", ENSEMBLE,
                       "BLEU", TEST, baseline=BEST_BLEU, paper_delta=0.27, paper_baseline=77.68, floors=test_floors,
                       gates=GATES),
        verdicts.Claim("P8", "the paper's filter brings the synthetic triplets' TER (mt vs pe) closer to the official "
                       "data's", "60.54 → 39.65 TER, 59% of eSCAPE-NMT kept (official data: 14.89)", "better",
                       FILTERED, "TER (mt vs pe)", "synthetic triplets", baseline=UNFILTERED, higher_is_better=False,
                       paper_delta=-20.89, paper_baseline=PAPER_TABLES["table1"]["eSCAPE-NMT"][1],
                       cost="at every scale of this book: it needs real machine translations (eSCAPE-NMT's 7.3M "
                            "triplets, or an En→De system's output for the 43k parallel sentences used here); our "
                            "synthetic MT injects errors at a rate we draw ourselves, on which a TER ≤ 75 filter "
                            "lowers TER by construction"),
        verdicts.Claim("O1", f"observation: the sequential decoder does at least as well as the parallel one (best "
                       f"model of each, dev TER{VALIDATED_ON})", "14.53 vs 14.75 TER, dev (−0.22; not claimed by the "
                       "paper)", "better", SEQUENTIAL, test_set=DEV, baseline=PARALLEL, paper_delta=-0.22,
                       paper_baseline=PAPER_TABLES["table2"]["Par w/ mask"][0.9][0], floors=dev_floors, **ter),
        verdicts.Claim("O2", f"observation: the future mask costs nothing: with it, no worse than without, within "
                       f"{MASK_MARGIN:g} TER (best α, mean over the two decoders, dev{VALIDATED_ON})",
                       "parallel 14.75 vs 14.93, sequential 14.73 vs 14.53 TER, dev (means 14.74 vs 14.73; not "
                       "claimed by the paper)", "parity", MASKED, test_set=DEV, baseline=UNMASKED,
                       margin=MASK_MARGIN, margin_reason="about the paper's own mask differences (−0.18 with the "
                       "parallel decoder, +0.20 with the sequential one)", floors=dev_floors, **decoders_ter),
    ]


# ---- the gates every APE claim rests on ----------------------------------------------------------------

def signed(value: float) -> str:
    return f"{value:+.2f}".replace("-", "−")


def start_gate_paper() -> str:
    """The paper's own figures beside the start gate (it has no start that copies mt)."""
    dev_nothing = PAPER_TABLES["table1"]["official development set"][1]
    primary, baseline = (PAPER_TABLES["table4"][name][0] for name in ("POSTECH_Primary (top2Ens8)", "Baseline"))
    generic = [cells[GENERIC][0] - dev_nothing for cells in PAPER_TABLES["table2"].values()]
    return (f"none for a start: the paper trains from random weights. Its whole effect is {signed(primary - baseline)} "
            f"test TER (Table 4: {primary} vs do-nothing {baseline}); its generic models sit {signed(min(generic))} to "
            f"{signed(max(generic))} dev TER from do-nothing (Table 2 vs Table 1's {dev_nothing})")


def generic_gate_paper() -> str:
    """The paper's own figures beside the generic-phase gate."""
    generic = [cells[GENERIC][0] for cells in PAPER_TABLES["table2"].values()]
    return (f"none for a start (the paper's generic models start from random weights, whose TER it does not "
            f"report); they end at {min(generic):.2f}–{max(generic):.2f} dev TER (Table 2, 'w/o tuning')")


def trained_gates(ch: Chapter) -> list[verdicts.Gate]:
    """The start gate: the denoiser copying mt, where every POSTECH system starts, loses at most START_MARGIN dev
    TER to do-nothing (a start further behind must first win back its own deficit). The generic gate: every generic
    model (the four architectures, the dual-source control, the concatenation baseline) beats its own start on
    dev TER (its best dev-BLEU checkpoint, as decoded for Table 2): the generic phase helped at all."""
    refs = references(ch, "val")

    def ter(hyps: list[str]) -> float:
        return corpus_score("ter", hyps, refs, **TER_CASED).score

    start = ter(initial_outputs(ch, "val"))
    starts = {**{system: start for system in (*ARCHITECTURES, DUAL)}, CONCAT: ter(concat_start_outputs(ch, "val"))}
    gains = [first - ter(run_outputs(ch, (system, GENERIC, ch.seed), "val")) for system, first in starts.items()]
    return [verdicts.Gate(GATE_START, start - ter(mt_outputs(ch, "val")), START_MARGIN, start_gate_paper(),
                          higher_is_better=False),
            verdicts.Gate(GATE_GENERIC, min(gains), GENERIC_GAIN, generic_gate_paper())]


# ---- the evidence: measures keyed by seed id, and every run's stages -----------------------------------

def held_out_half(ch: Chapter) -> int:
    """Where the scored dev triplets split: α is chosen on those before it, P1 is scored on those after."""
    return split_limit(ch, "val") // 2


def scored_sets(ch: Chapter) -> dict[str, tuple[slice, str]]:
    """Each scored set a claim names: (which of the split's scored triplets, the split)."""
    return {TEST: (slice(None), "test"), DEV: (slice(None), "val"),
            DEV_HELD_OUT: (slice(held_out_half(ch), None), "val")}


def scored_part(ch: Chapter, test_set: str, outputs_of_split) -> list[str]:
    """The part of a split's outputs (`outputs_of_split(split) -> list[str]`) a scored set covers."""
    part, split = scored_sets(ch)[test_set]
    return outputs_of_split(split)[part]


def scored_references(ch: Chapter, test_set: str) -> list[str]:
    return scored_part(ch, test_set, lambda split: references(ch, split))


def key_outputs(ch: Chapter, key: tuple, test_set: str) -> list[str]:
    return scored_part(ch, test_set, lambda split: run_outputs(ch, key, split))


def text_measures(outputs: dict[int, list[str]], refs: list[str]) -> dict[str, verdicts.Measure]:
    """Every CLAIM_METRICS label of each seed's outputs, with its bootstrap replicates."""
    return {label: verdicts.text_measure(metric, outputs, refs, **options)
            for label, (metric, options) in CLAIM_METRICS.items()}


def mean_ter_measure(seed: int, outputs: list[list[str]], refs: list[str]) -> verdicts.Measure:
    """The mean cased TER of several models' outputs on the same sentences, under one seed id, with its bootstrap
    replicates (each resampling scores every model on the same sentences)."""
    stats = [sentence_statistics("ter", hyps, refs, **TER_CASED) for hyps in outputs]
    width, corpus_ter = stats[0].shape[1], statistics_scorer("ter", **TER_CASED)

    def mean_ter(totals) -> float:
        return statistics.fmean(corpus_ter(totals[i * width:(i + 1) * width]) for i in range(len(outputs)))
    signature = f"mean of {len(outputs)} models' " + corpus_score("ter", outputs[0], refs, **TER_CASED).signature
    return verdicts.statistics_measure({seed: np.hstack(stats)}, mean_ter, signature)


def pretraining_stage(ch: Chapter) -> verdicts.Stage:
    """The denoising pre-training every system starts from (its dev score: BLEU reconstructing held-out text)."""
    recipe = ch.denoiser.scale.pretrain
    return verdicts.stage_from_history("denoising pre-training (dev: reconstruction BLEU)", ch.denoiser.run.history,
                                       recipe.patience, schedule=verdicts.schedule_of(recipe))


def phase_stages(ch: Chapter, key: tuple) -> list[verdicts.Stage]:
    """A model's own stages (system, alpha or GENERIC, seed): its architecture's generic phase (shared by its
    fine-tuning runs, trained on the chapter's seed; judged for convergence, as the paper's "after reaching the
    convergence point in the first phase"), then its fine-tuning phase. Both validate on dev BLEU."""
    system, alpha, seed = key
    generic, finetuned = ch.scale.generic, ch.scale.finetune
    stages = [verdicts.stage_from_history(f"{system}: generic phase (dev BLEU)",
                                          ch.runs[system, GENERIC, ch.seed].history, generic.patience,
                                          schedule=verdicts.schedule_of(generic))]
    if alpha != GENERIC:
        stages.append(verdicts.stage_from_history(f"{system}: fine-tuning α = {alpha:g}, seed {seed} (dev BLEU)",
                                                  ch.runs[key].history, finetuned.patience,
                                                  schedule=verdicts.schedule_of(finetuned)))
    return stages


def run_record(ch: Chapter, seed: int, keys: list[tuple]) -> verdicts.RunRecord:
    """The run behind one seed id of a system made of the models `keys`: the pre-training, then each model's
    stages in order (a generic phase two of them share, once)."""
    stages = [pretraining_stage(ch)]
    for key in keys:
        stages += [stage for stage in phase_stages(ch, key) if stage not in stages]
    return verdicts.RunRecord(seed, tuple(stages))


def model_system(ch: Chapter, name: str, keys: dict[int, tuple], test_sets: tuple[str, ...]) -> verdicts.System:
    """A system of one model per seed id (seed -> its key (system, alpha, seed)): its TER and BLEU on each scored
    set, and each seed's run."""
    measures = {test_set: text_measures({seed: key_outputs(ch, key, test_set) for seed, key in keys.items()},
                                        scored_references(ch, test_set)) for test_set in test_sets}
    return verdicts.trained_system(name, measures, [run_record(ch, seed, [key]) for seed, key in keys.items()])


def pooled_system(ch: Chapter, name: str, keys: list[tuple], test_sets: tuple[str, ...]) -> verdicts.System:
    """Several architectures' models on the chapter's seed as one system: their mean TER (`mean_label`) on each
    scored set, and one run holding every model's stages."""
    measures = {test_set: {mean_label(len(keys)): mean_ter_measure(ch.seed, [key_outputs(ch, key, test_set)
                                                                             for key in keys],
                                                                   scored_references(ch, test_set))}
                for test_set in test_sets}
    return verdicts.trained_system(name, measures, [run_record(ch, ch.seed, keys)])


def ensemble_system(ch: Chapter, ensemble_name: str, members: list[tuple]) -> verdicts.System:
    """The ensemble chosen on dev (`ensemble_name`, its (system, alpha) `members`) on test and dev."""
    # An ensemble's seed is the fine-tuning seed its members share: Table 3's ensembles are built from the Table 2
    # sweep, whose models are all fine-tuned on the chapter's seed, so the ensemble is scored under that one seed id.
    # Its run is its members' runs: the shared pre-training, each member architecture's generic phase, each
    # member's fine-tuning.
    measures = {test_set: text_measures({ch.seed: scored_part(ch, test_set, lambda split: ensemble_outputs(
        ch, ensemble_name, members, split))}, scored_references(ch, test_set)) for test_set in (TEST, DEV)}
    keys = [(system, alpha, ch.seed) for system, alpha in members]
    return verdicts.trained_system(ENSEMBLE, measures, [run_record(ch, ch.seed, keys)])


def best_of(ch: Chapter, dev: dict[tuple, dict[str, float]], systems) -> tuple:
    """The first seed's fine-tuned model (system, alpha, seed) of `systems` with the lowest TER in `dev`
    (`dev_table`; ties: the first listed)."""
    return min(((system, alpha, ch.seed) for system in systems for alpha in ch.scale.ratios),
               key=lambda key: dev[key[:2]]["TER"])


def below_one(ch: Chapter) -> list[tuple]:
    """Per architecture, its fine-tuned model at the α < 1 with the lowest TER on the first half of dev (P1)."""
    first_half = slice(None, held_out_half(ch))
    refs = references(ch, "val")[first_half]
    return [min(((system, alpha, ch.seed) for alpha in ch.scale.ratios[1:]),
                key=lambda key: ape_scores(run_outputs(ch, key, "val")[first_half], refs)["TER"])
            for system in ARCHITECTURES]


def architecture_systems(ch: Chapter) -> dict[str, verdicts.System]:
    """The dev comparisons over architectures: P1, P2 and O2 on pooled systems, O1 on the best model of each
    decoder."""
    dev = dev_table(ch)
    systems = {
        TUNED: pooled_system(ch, TUNED, [(system, 1.0, ch.seed) for system in ARCHITECTURES], (DEV, DEV_HELD_OUT)),
        GENERIC_EACH: pooled_system(ch, GENERIC_EACH, [(system, GENERIC, ch.seed) for system in ARCHITECTURES],
                                    (DEV,)),
        MASKED: pooled_system(ch, MASKED, [best_of(ch, dev, [pair[0]]) for pair in DECODERS.values()], (DEV,)),
        UNMASKED: pooled_system(ch, UNMASKED, [best_of(ch, dev, [pair[1]]) for pair in DECODERS.values()], (DEV,)),
        **{name: model_system(ch, name, {ch.seed: best_of(ch, dev, DECODERS[decoder])}, (DEV,))
           for name, decoder in ((SEQUENTIAL, "sequential"), (PARALLEL, "parallel"))},
    }
    if len(ch.scale.ratios) > 1:
        systems[TUNED_BELOW_1] = pooled_system(ch, TUNED_BELOW_1, below_one(ch), (DEV_HELD_OUT,))
    return systems


def chapter_systems(ch: Chapter, ensemble_name: str, members: list[tuple]) -> dict[str, verdicts.System]:
    """Every trained system a claim names: the best single model by dev TER on every seed, the best by dev BLEU
    (P5's baseline, on the chapter's seed, as the ensemble), the ensemble chosen on dev, the controls (the
    dual-source control and its joint twin on every seed, the concatenation baseline on the chapter's seed), and
    the architecture comparisons."""
    best, by_bleu = best_single(ch), best_single(ch, "BLEU")
    return {BEST: model_system(ch, BEST, {s: (*best, s) for s in seeds(ch)}, (TEST,)),
            BEST_BLEU: model_system(ch, BEST_BLEU, {ch.seed: (*by_bleu, ch.seed)}, (TEST, DEV)),
            ENSEMBLE: ensemble_system(ch, ensemble_name, members),
            CONCAT: model_system(ch, CONCAT, {ch.seed: (CONCAT, 1.0, ch.seed)}, (TEST,)),
            DUAL: model_system(ch, DUAL, {s: (DUAL, 1.0, s) for s in seeds(ch)}, (TEST,)),
            JOINT_SEQ: model_system(ch, JOINT_SEQ, {s: (JOINT_SEQ_ARCHITECTURE, 1.0, s) for s in seeds(ch)}, (TEST,)),
            **architecture_systems(ch)}


# ---- the floors ------------------------------------------------------------------------------------------

def constant_sentences(selection_refs: list[str]) -> dict[str, str]:
    """Per metric label, the best constant output chosen on `selection_refs` (`floors.best_constant`; TER among
    the first TER_CONSTANT_CANDIDATES references, by cased TER like every system)."""
    return {"TER": floors.best_constant(selection_refs, selection_refs, "ter", TER_CONSTANT_CANDIDATES,
                                        **TER_CASED)[0],
            "BLEU": floors.best_constant(selection_refs, selection_refs, "bleu")[0]}


def floor_part(name: str, test_set: str, outputs: dict[str, list[str]], refs: list[str]) -> verdicts.System:
    """One floor on one scored set, scored exactly as the systems: every CLAIM_METRICS label of its outputs for
    that label, and the pooled systems' mean TER (the TER outputs, once per model of the pool)."""
    parts = [verdicts.floor_from_outputs(name, test_set, label, metric, outputs[label], refs, **options)
             for label, (metric, options) in CLAIM_METRICS.items()]
    pooled = {mean_label(n): mean_ter_measure(verdicts.FLOOR, [outputs["TER"]] * n, refs)
              for n in sorted({len(ARCHITECTURES), len(DECODERS)})}
    return verdicts.merged_floor(name, [*parts, verdicts.System(name, {test_set: pooled}, floor=True)])


def floor_systems(ch: Chapter) -> dict[str, verdicts.System]:
    """The floors on each scored set: do-nothing (the MT, unchanged: APE's copy of the input), the best constant
    output (chosen on the first 300 dev post-edits for test, on the first 300 training post-edits for dev: never on
    the set it is scored on), and on dev the untrained start (the denoiser reading mt, decoded like every system)."""
    first = slice(None, floors.CONSTANT_CANDIDATES)
    constants = {TEST: constant_sentences(references(ch, "val")[first]),
                 DEV: constant_sentences(list(ch.ape.corpora["train"].target[first]))}
    constants[DEV_HELD_OUT] = constants[DEV]
    parts: dict[str, list[verdicts.System]] = {DO_NOTHING: [], CONSTANT: [], INITIAL: []}
    for test_set, (_, split) in scored_sets(ch).items():
        refs = scored_references(ch, test_set)
        outputs = {DO_NOTHING: scored_part(ch, test_set, lambda s: mt_outputs(ch, s))}
        if split == "val":
            outputs[INITIAL] = scored_part(ch, test_set, lambda s: initial_outputs(ch, s))
        for name, hyps in outputs.items():
            parts[name].append(floor_part(name, test_set, {label: hyps for label in CLAIM_METRICS}, refs))
        parts[CONSTANT].append(floor_part(CONSTANT, test_set, {label: [sentence] * len(refs) for label, sentence
                                                               in constants[test_set].items()}, refs))
    return {name: verdicts.merged_floor(name, systems) for name, systems in parts.items()}


def floor_table(floor_systems_: dict[str, verdicts.System]) -> list[dict]:
    """One row per floor and scored set: its TER (cased) and BLEU."""
    return [{"floor": name, "scored on": test_set, **{label: by_label[label].values()[0] for label in CLAIM_METRICS}}
            for name, system in floor_systems_.items() for test_set, by_label in system.measures.items()]
