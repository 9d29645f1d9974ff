"""Recipes the chapters run: data preparation, one training run through the run cache, evaluation, at a named scale.

The notebooks call these functions and then explain, tabulate and plot; a GPU user can run the same recipes as a
script. Each scale is data, so a chapter's settings are readable in one place. The layers run one way: this module
and the core below it, then the models (`msgcore.models`), the shared foundation runs (`msgcore.foundations`:
chapter 0's baselines, the denoising model), then each paper's own stages (`msgcore.experiments.<paper>`).
"""
from __future__ import annotations

import contextlib
import json
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from msgcore import distributed, dryrun, runcache
from msgcore.batching import EncodedCorpus, encode_corpus
from msgcore.data import Corpus, load_multi30k, synthetic_corpus
from msgcore.generation import GenerationConfig
from msgcore.metrics import Score, corpus_score
from msgcore.model import Transformer, TransformerConfig, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, TrainConfig, translate_encoded
from msgcore.utils import DataError, MsgcoreError, atomic_write


# The fastest measured CPU setting for training (book/benchmarks: bf16 autocast on a CPU with AVX-512 BF16 or AMX,
# and torch's math attention kernel, which computes Multi30k's short sentences faster than its fused kernel under
# bf16). Every `small` recipe trains with it; on a GPU the math-kernel choice is dropped (Trainer.resolve_sdpa_backends).
CPU_BOOK_SETTING = dict(amp="bf16", sdpa_backends=("math",))


@dataclass
class Scale:
    """Everything a scale changes for a translation run."""

    preset: str  # model preset (msgcore.model.PRESETS)
    model: dict  # overrides of the preset, e.g. dropout
    train: TrainConfig  # optimisation and validation settings
    vocab_size: int = 8000  # joint sentencepiece vocabulary
    train_examples: int = 0  # use the first N training pairs (0 = all)
    test_examples: int = 0  # evaluate on the first N test sentences (0 = all)
    beam_size: int = 5  # test-time beam
    max_len: int = 128  # truncate training sentences to this many pieces
    notes: str = ""  # what a reader should know about this scale


def get_scale(scales: dict[str, Scale], name: str) -> Scale:
    if name not in scales:
        raise MsgcoreError(f"unknown scale {name!r}; choose one of {', '.join(scales)}")
    return scales[name]


@dataclass
class TranslationData:
    """A direction's corpora, the joint tokenizer and the encoded splits."""

    tokenizer: Tokenizer
    corpora: dict[str, Corpus]  # split -> corpus
    encoded: dict[str, EncodedCorpus] = field(default_factory=dict)  # split -> token ids
    synthetic: bool = False  # True when the real data was unavailable and the toy corpus stood in


def load_multi30k_splits(sources: tuple[str, ...], target: str, splits: tuple[str, ...]) -> dict[str, Corpus]:
    return {split: load_multi30k(split, sources=sources, target=target) for split in splits}


def synthetic_splits(splits: tuple[str, ...], num_sources: int, seed: int) -> dict[str, Corpus]:
    """The offline fallback: the toy corpus under the same split names."""
    sizes = {"train": 3000}
    return {s: synthetic_corpus(sizes.get(s, 200), num_sources=num_sources, seed=seed,
                                split="train" if s == "train" else "val" if s == "val" else "test")
            for s in splits}


def prepare_translation(source: str | tuple[str, ...], target: str, scale: Scale, seed: int = 0,
                        splits=("train", "val", "test_2016_flickr", "test_2017_flickr"),
                        tokenizer: Tokenizer | None = None, allow_synthetic: bool = False) -> TranslationData:
    """Load Multi30k source(s)->target, train (or reuse) a joint tokenizer, encode every split.

    With `allow_synthetic`, a machine that has neither the data nor a mirror nor the network falls
    back to the seeded toy corpus (smoke runs only), and says so.
    """
    sources = (source,) if isinstance(source, str) else tuple(source)
    try:
        corpora, synthetic = load_multi30k_splits(sources, target, splits), False
    except DataError as error:
        if not allow_synthetic or "MSGCORE_DATA_MIRROR" not in str(error):
            raise
        print(f"Multi30k is unavailable ({error}); using the synthetic corpus instead.")
        corpora, synthetic = synthetic_splits(splits, len(sources), seed), True
    if scale.train_examples:
        corpora["train"] = corpora["train"].subset(range(min(scale.train_examples, len(corpora["train"]))))
    if tokenizer is None:
        train = corpora["train"]
        tokenizer = Tokenizer.train(train.texts(), vocab_size=scale.vocab_size, model_type="unigram",
                                    langs=(*train.source_langs, train.target_lang), seed=seed)
    data = TranslationData(tokenizer, corpora, synthetic=synthetic)
    for split, corpus in corpora.items():
        data.encoded[split] = encode_corpus(corpus, tokenizer, max_len=scale.max_len if split == "train" else None)
    return data


def limit_eval_splits(data: TranslationData, n: int) -> TranslationData:
    """Keep the first `n` sentences of every split but "train" (n = 0: keep everything)."""
    if not n:
        return data
    corpora = {s: c if s == "train" else c.subset(range(min(n, len(c)))) for s, c in data.corpora.items()}
    encoded = {s: e if s == "train" else EncodedCorpus([col[:n] for col in e.sources], e.target[:n], e.target_prefix,
                                                       e.eos_id) for s, e in data.encoded.items()}
    return replace(data, corpora=corpora, encoded=encoded)


@dataclass
class RunResult:
    model: Transformer  # the best checkpoint's model, in eval mode
    history: list[dict]  # the trainer's log rows
    wall_time_s: float  # training wall time (of the original run, when reused from the cache)
    out_dir: Path  # where log.json and the checkpoints are (the run cache's entry, when the cache is on)
    reused: bool = False  # True when the run came from the run cache instead of being trained now

    @property
    def updates(self) -> int:
        """The updates it trained (fewer than its cap when early stopping ended it)."""
        return max((row["step"] for row in self.history), default=0)


def train_translation(data: TranslationData, scale: Scale, device: torch.device, out_dir: str | Path,
                      seed: int = 0, progress: bool = False) -> RunResult:
    """Build the scale's model, train it, and reload the best checkpoint (by dev BLEU)."""
    torch.manual_seed(seed)
    cfg: TransformerConfig = preset(scale.preset, vocab_size=data.tokenizer.vocab_size,
                                    pad_id=data.tokenizer.pad_id, **scale.model)
    return train_model(Transformer(cfg), data, replace(scale.train, seed=seed, progress=progress), device, out_dir)


def run_key(model, train_cfg: TrainConfig, train: EncodedCorpus, valid: EncodedCorpus, refs: list[str],
            trainer_class: type[Trainer] = Trainer, device: torch.device | str = "cpu") -> str:
    """What decides a training run's result: the model (class, every config field, initial weights), the recipe
    (every field), the data, the trainer class, the precision the device resolves to, the SDPA backends, and the
    code (`runcache.code_fingerprint`: the shared core, the model's and the trainer's modules, torch's version).
    The device itself does not: a GPU run in fp32 serves a CPU notebook in fp32."""
    recipe = replace(train_cfg, progress=False, log_every=TrainConfig.log_every)  # neither changes the result
    numerics = {"precision": str(Trainer.resolve_amp(train_cfg.amp, torch.device(device))),
                "sdpa": [str(b) for b in Trainer.resolve_sdpa_backends(train_cfg.sdpa_backends, torch.device(device))]}
    parts = [type(model).__name__, model.cfg, model.state_dict(), recipe, train, valid, refs, trainer_class.__name__,
             numerics, runcache.code_fingerprint(type(model), trainer_class)]
    frozen = [name for name, parameter in model.named_parameters() if not parameter.requires_grad]
    if frozen:  # a run that trains only some parameters is another run
        parts.append(("frozen", frozen))
    return runcache.fingerprint(*parts)


def train_model(model, data: TranslationData, train_cfg: TrainConfig, device: torch.device,
                out_dir: str | Path, train: EncodedCorpus | None = None,
                valid: EncodedCorpus | None = None, trainer_class: type[Trainer] = Trainer) -> RunResult:
    """Train `model` on data.encoded["train"] (or `train`), validate on "val" (or `valid`, same
    references), and reload the checkpoint with the best dev BLEU. `trainer_class` is a Trainer whose hooks
    collate the data's examples (e.g. msgcore.models.mixrep.MixRepTrainer for two segmentations).

    The run goes through the run cache (msgcore.runcache): a finished run with the same key is loaded
    instead of trained, an interrupted one resumes from its last.pt. `out_dir/run.json` points at the entry."""
    train, valid = train or data.encoded["train"], valid or data.encoded["val"]
    refs = data.corpora["val"].target
    train_cfg = dryrun.train_config(train_cfg)  # a dry run's caps, if any
    entry = runcache.entry_dir("run", run_key(model, train_cfg, train, valid, refs, trainer_class, device))
    folder = entry or Path(out_dir)
    holding = runcache.entry_lock(entry) if entry and not distributed.launched() else contextlib.nullcontext()
    with holding:  # a second process asking for this run waits for the first, then reuses it
        meta = runcache.finished(entry) if entry else None
        if meta is not None:
            result = load_finished_run(model, folder, meta, device)
        else:
            if entry:
                runcache.begin(entry)
            result = run_training(model, data, train_cfg, device, folder, train, valid, refs, trainer_class)
            if entry:
                (folder / "last.pt").unlink(missing_ok=True)  # the optimizer state is not needed once finished
                runcache.mark_finished(folder, ["best.pt", "log.json"], wall_time_s=result.wall_time_s,
                                       device=str(device), model_class=type(model).__name__)
    if entry:
        with atomic_write(Path(out_dir) / "run.json") as f:
            json.dump({"cache_entry": str(folder), "reused": result.reused}, f)
    return result


def run_training(model, data: TranslationData, train_cfg: TrainConfig, device: torch.device, folder: Path,
                 train: EncodedCorpus, valid: EncodedCorpus, refs: list[str],
                 trainer_class: type[Trainer] = Trainer) -> RunResult:
    trainer = trainer_class(model, data.tokenizer, train, valid, refs, train_cfg, device, folder)
    if (folder / "last.pt").is_file():
        print(f"resuming the interrupted run {folder.name} (run cache)")  # its name: a page shows no machine path
        trainer.resume(folder / "last.pt")
    start, before = time.perf_counter(), trainer.state.wall_time_s  # an interrupted run's time counts too
    history = trainer.train()
    wall = before + time.perf_counter() - start
    trainer.resume(folder / "best.pt")
    return RunResult(trainer.model.eval(), history, wall, folder)


def load_finished_run(model, folder: Path, meta: dict, device: torch.device) -> RunResult:
    from msgcore.trainer import load_checkpoint

    model.load_state_dict(load_checkpoint(folder / "best.pt")["model"])
    history = json.loads((folder / "log.json").read_text())
    runcache.note_reused(folder.name)
    print(f"reused cached run {folder.name} (trained in {meta['wall_time_s'] / 60:.1f} min on {meta['device']})")
    return RunResult(model.to(device).eval(), history, meta["wall_time_s"], folder, reused=True)


def evaluate(model, data: TranslationData, split: str, scale: Scale, device: torch.device,
             amp_dtype=None) -> tuple[list[str], dict[str, Score]]:
    """Beam-search the split, then BLEU and chrF (cased, detokenized) and the lowercased-13a BLEU."""
    encoded, refs = data.encoded[split], data.corpora[split].target
    limit = scale.test_examples or len(refs)
    hyps = translate_encoded(model, data.tokenizer, encoded, device, GenerationConfig(beam_size=scale.beam_size),
                             limit=limit, amp_dtype=amp_dtype)
    refs = refs[:limit]
    scores = {"BLEU": corpus_score("bleu", hyps, refs, n_bootstrap=1000),
              "chrF": corpus_score("chrf", hyps, refs, n_bootstrap=1000),
              "BLEU (lowercased)": corpus_score("bleu", hyps, refs, lowercase=True)}
    return hyps, scores


def paired_delta(references: list[str], baseline: list[str], system: list[str], metric: str = "bleu",
                 n_samples: int = 1000) -> tuple[float, float]:
    """(system - baseline score, paired-bootstrap p-value) for one metric (msgcore.verdicts.paired_bootstrap)."""
    from msgcore.verdicts import paired_bootstrap

    return paired_bootstrap(references, baseline, system, metric, n_samples)


def mean_std(values) -> str:
    """"mean ± std" over runs (seeds), with two decimals; just the value for a single run."""
    values = list(values)
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
