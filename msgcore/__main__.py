"""Command line: `python -m msgcore {train,translate,score}`; `python -m msgcore CMD --help` for options.

    python -m msgcore train --dataset multi30k --sources de --target en --preset tiny --out runs/de-en
    python -m msgcore train ... --out runs/de-en --resume runs/de-en/last.pt   # continue a killed run
    python -m msgcore translate --checkpoint runs/de-en/best.pt --input test.de --output hyp.en
    python -m msgcore score --hyp hyp.en --ref test.en --metrics bleu chrf ter
    torchrun --nproc_per_node=4 -m msgcore train ...       # data-parallel on 4 GPUs (msgcore.distributed)

Every bad input is refused with one line starting "error: " (exit status 2) before any work is spent,
and no partial output file is left behind; tests/README.md lists the cases.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import shutil
import sys
from pathlib import Path

import torch

from msgcore import distributed, download
from msgcore.batching import EncodedCorpus, encode_corpus
from msgcore.data import Corpus, check_same_length, load_ape, load_mlqe_pe, load_multi30k, read_lines, read_parallel, \
    synthetic_corpus
from msgcore.experiments import CLI_RECIPE_SCALES, cli_recipe
from msgcore.generation import GenerationConfig
from msgcore.metrics import score_all
from msgcore.model import PRESETS, Transformer, preset
from msgcore.options import OneLineParser, device_option, real, seed_option, whole
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, TrainConfig, best_on_disk, checkpoint_space, load_checkpoint, load_model, \
    translate_encoded
from msgcore.utils import MsgcoreError, atomic_write, check_writable_dir, check_writable_file, nearest_existing, \
    os_error_line, pid_lock, resolve_device, seed_everything

RUN_FILES = ("last.pt", "best.pt", "log.json")  # a folder holding any of these is an existing run
LOCK_NAME = ".lock"
ONE_SOURCE_MODELS = ("Transformer", "CoverageNAT")  # checkpoint classes that read exactly one --input
DEFAULT_PRESET, DEFAULT_SEED, DEFAULT_SPM = "small", 0, "unigram"
# Options a resumed run must share with its checkpoint (they shape the model, the tokenizer or the batches).
RESUME_FIXED = ("preset", "vocab_size", "spm_type", "dropout", "lr", "warmup", "max_tokens", "batches_per_update",
                "seed")
SKIP_EMPTY_HINT = "pass --skip-empty to drop such examples"
# Library hints that name Python arguments, and what the command line says instead.
CLI_WORDING = {"pass skip_empty=True to drop such examples": SKIP_EMPTY_HINT,
               "concatenate them (Batch.concatenated) or use a multi-source model": "give one --input file"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default; an option whose default is None says in its help what it defaults to."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


# ---------------------------------------------------------------------------- train: settle and check options

def recipe_help(name: str, what: str) -> str:
    values = ", ".join(f"{p} {cli_recipe(p)[name]}" for p in sorted(PRESETS))
    return f"{what} (default: chapter 0's recipe for the preset: {values}; on --resume, the checkpoint's)"


def checkpoint_options(checkpoint: dict) -> dict:
    """The options a checkpoint was trained with (those the CLI recorded, else what its configs say)."""
    recorded = (checkpoint.get("run_info") or {}).get("options")
    if recorded:
        return recorded
    train_cfg, model_cfg = checkpoint["train_config"], checkpoint["model_config"]
    return {"dropout": model_cfg.get("dropout"), "lr": train_cfg["lr"], "warmup": train_cfg["warmup_steps"],
            "max_tokens": train_cfg["max_tokens"], "batches_per_update": train_cfg["update_freq"],
            "seed": train_cfg["seed"]}


def run_options(args) -> dict:
    """What RESUME_FIXED compares: the settled options, the batches per update counted over every process."""
    options = {name: getattr(args, name) for name in RESUME_FIXED if name != "batches_per_update"}
    return {**options, "batches_per_update": args.update_freq * max(1, distributed.world_size())}


def settle_options(args, checkpoint: dict | None) -> None:
    """Fill options left out: from the checkpoint when resuming, else from the preset's recipe.

    A resumed run that asks for another value of a RESUME_FIXED option is refused, naming the options."""
    given = {name for name in RESUME_FIXED if getattr(args, name, None) is not None}
    given |= {"batches_per_update"} if args.update_freq is not None else set()
    if checkpoint is not None:
        previous = checkpoint_options(checkpoint)
        for name, value in previous.items():
            if name in RESUME_FIXED and name != "batches_per_update" and getattr(args, name) is None:
                setattr(args, name, value)
    args.preset = args.preset or DEFAULT_PRESET
    args.seed = DEFAULT_SEED if args.seed is None else args.seed
    args.spm_type = args.spm_type or DEFAULT_SPM
    if args.update_freq is None:  # the checkpoint's batches per update, spread over this run's processes
        per_update = checkpoint_options(checkpoint).get("batches_per_update", 1) if checkpoint is not None else 1
        args.update_freq = max(1, per_update // max(1, distributed.world_size()))
    for name, value in cli_recipe(args.preset).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if checkpoint is not None:
        refuse_changes(args, checkpoint_options(checkpoint), given)


def refuse_changes(args, previous: dict, given: set[str]) -> None:
    now = run_options(args)
    changed = [name for name in RESUME_FIXED if name in given and name in previous and previous[name] != now[name]]
    if changed:
        was = ", ".join(f"{name}={previous[name]}" for name in changed)
        asked = ", ".join(f"{name}={now[name]}" for name in changed)
        raise MsgcoreError(f"--resume {args.resume} was trained with {was} but this run asks for {asked}; "
                           f"leave these options out to keep the checkpoint's, or start a new run in another --out")


def check_train_request(args) -> None:
    """Checks of the command line itself, before anything is read or written."""
    if bool(args.train_files) != bool(args.valid_files):
        raise MsgcoreError("--train-files and --valid-files go together")
    if args.train_files and len(args.train_files) != len(args.valid_files):
        raise MsgcoreError(f"--train-files has {len(args.train_files)} files but --valid-files has "
                           f"{len(args.valid_files)}; give one validation file per training file (SRC... TGT)")
    if args.resume and args.overwrite:
        raise MsgcoreError("--resume and --overwrite contradict each other; give one")
    for option, paths in (("--train-files", args.train_files), ("--valid-files", args.valid_files),
                          ("--resume", [args.resume] if args.resume else [])):
        check_input_files(paths or [], option)


def check_input_files(paths, option: str) -> None:
    for path in map(Path, paths):
        if path.is_dir():
            raise MsgcoreError(f"{option} {path} is a folder, not a file")
        if not path.is_file():
            raise MsgcoreError(f"{option} {path}: no such file")


def check_run_folder(args) -> None:
    """--out must be a writable folder, and not another run's unless --resume or --overwrite says so."""
    out = Path(args.out)
    check_writable_dir(out, "--out")
    existing = [name for name in RUN_FILES if (out / name).exists()]
    if existing and not (args.resume or args.overwrite):
        raise MsgcoreError(f"--out {out} already holds a run ({', '.join(existing)}); pass --resume {out / 'last.pt'} "
                           f"to continue it, --overwrite to replace it, or choose another --out")
    cache = download.cache_dir()
    if cache.exists() and not cache.is_dir():
        raise MsgcoreError(f"MSGCORE_DATA={cache} is a file, not a folder; point it at a folder (or unset it)")


def check_free_space(args, checkpoint: dict | None) -> None:
    """Refuse, before the tokenizer and any training step, an --out whose disk cannot hold the run's checkpoints
    (the model is built on the meta device, which allocates nothing, to count its parameters)."""
    vocab = checkpoint["model_config"]["vocab_size"] if checkpoint is not None else args.vocab_size
    with torch.device("meta"):
        model = Transformer(preset(args.preset, vocab_size=vocab, pad_id=0, dropout=args.dropout or 0.0))
    out = Path(args.out)
    needed = checkpoint_space(sum(p.numel() for p in model.parameters()), out)
    free = shutil.disk_usage(nearest_existing(out)).free
    if free < needed:
        raise MsgcoreError(f"--out {out}: {size_text(free)} free on its disk, but this run's checkpoints need about "
                           f"{size_text(needed)} (last.pt with the optimizer's state, written beside the previous "
                           f"one, and best.pt); free some space or choose another --out")


def size_text(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def run_lock(out: Path):
    """Hold OUT/.lock (holding our pid) while training, so that two runs never write one folder."""
    def refuse(pid: int) -> None:
        raise MsgcoreError(f"another run (pid {pid}) is writing to {out}; wait for it to end, or choose another "
                           f"--out (delete {out / LOCK_NAME} only if that process is not a msgcore run)")
    return pid_lock(out / LOCK_NAME, refuse, f"train into {out}")


# ---------------------------------------------------------------------------- train: data

def load_split(args, split: str) -> Corpus:
    """The training or validation corpus named on the command line."""
    if args.train_files:
        files = args.train_files if split == "train" else args.valid_files
        columns = read_parallel(files, skip_empty=args.skip_empty, hint=SKIP_EMPTY_HINT)
        langs = tuple(f"src{k}" for k in range(len(files) - 1))
        return Corpus("files", split, langs, "tgt", columns[:-1], columns[-1])
    if args.dataset == "multi30k":
        return load_multi30k("train" if split == "train" else "val", sources=args.sources, target=args.target,
                             skip_empty=args.skip_empty)
    if args.dataset == "ape":
        return load_ape("train" if split == "train" else "dev", skip_empty=args.skip_empty)
    if args.dataset == "mlqe-pe":
        return load_mlqe_pe("train" if split == "train" else "dev", skip_empty=args.skip_empty)
    return synthetic_corpus(3000 if split == "train" else 200, num_sources=len(args.sources), seed=args.seed,
                            split="train" if split == "train" else "val")


def check_corpora(args, train_corpus: Corpus, valid_corpus: Corpus) -> None:
    if train_corpus.num_sources != 1:
        raise MsgcoreError(f"the Transformer takes 1 source, the data has {train_corpus.num_sources}")
    if valid_corpus.num_sources != train_corpus.num_sources:
        raise MsgcoreError(f"the validation data has {valid_corpus.num_sources} sources but the training data "
                           f"{train_corpus.num_sources}")
    for what, corpus in (("training", train_corpus), ("validation", valid_corpus)):
        if not len(corpus):
            files = " ".join(args.train_files if what == "training" else args.valid_files or [])
            raise MsgcoreError(f"the {what} data is empty{' (' + files + ')' if files else ''}")


def corpus_fingerprint(corpus: Corpus) -> str:
    """sha256 of every sentence: a resumed run must read the same training data."""
    digest = hashlib.sha256()
    for text in corpus.texts():
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def run_tokenizer(args, train_corpus: Corpus, checkpoint: dict | None) -> Tokenizer:
    """The checkpoint's tokenizer when resuming (never a retrained one), else one trained on the data."""
    if checkpoint is not None:
        if checkpoint.get("tokenizer") is None:
            raise MsgcoreError(f"--resume {args.resume} holds no tokenizer; it was not written by this command")
        return Tokenizer.from_bytes(checkpoint["tokenizer"])
    return Tokenizer.train(train_corpus.texts(), vocab_size=args.vocab_size, model_type=args.spm_type,
                           seed=args.seed)


def check_same_data(args, checkpoint: dict, fingerprint: str, valid_fingerprint: str) -> None:
    """A resumed run must read the training and the validation data it started with: both are part of the run."""
    recorded = checkpoint.get("run_info") or {}
    for what, key, now in (("training", "train_data", fingerprint), ("validation", "valid_data", valid_fingerprint)):
        if recorded.get(key) and recorded[key] != now:
            files = "--valid-files" if key == "valid_data" else "--dataset/--sources/--train-files"
            raise MsgcoreError(f"--resume {args.resume} was trained on other {what} data; resume with the same "
                               f"{files}, or start a new run in another --out")


def source_limit(model, cfg: GenerationConfig) -> int:
    """The longest source (pieces, before eos) whose output budget a * |x| + b fits the position table."""
    positions = getattr(model.cfg, "max_positions", 1024)
    return max(1, int((positions - cfg.max_len_b) / max(cfg.max_len_a, 1.0)) - 1)


def truncate_sources(encoded: EncodedCorpus, limit: int, line_numbers: list[int]) -> list[int]:
    """Cut sources longer than `limit` pieces (keeping eos); returns the line numbers that were cut."""
    cut = set()
    for column in encoded.sources:
        for i, ids in enumerate(column):
            if len(ids) - 1 > limit:
                column[i] = ids[:limit] + ids[-1:]
                cut.add(line_numbers[i])
    return sorted(cut)


# ---------------------------------------------------------------------------- train

def train(args) -> None:
    """Train a Transformer; under torchrun, one data-parallel process per GPU (or CPU worker)."""
    check_train_request(args)
    if distributed.launched():
        device = distributed.device_for_rank(args.device)
        distributed.init(device)
    else:
        device = resolve_device(args.device)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint is not None and checkpoint["optimizer"] is None:
        raise MsgcoreError(f"{args.resume} holds a best model without its optimizer state; resume from the run's "
                           f"last.pt")
    settle_options(args, checkpoint)
    check_run_folder(args)
    check_free_space(args, checkpoint)
    seed_everything(args.seed)
    main_process = distributed.is_main()
    with run_lock(Path(args.out)) if main_process else contextlib.nullcontext():
        trainer = build_trainer(args, device, checkpoint)
        try:
            trainer.train()
        except BaseException:
            distributed.shutdown(together=False)
            raise
        distributed.shutdown()
    if main_process:
        print(run_summary(trainer, args.out))


def build_trainer(args, device, checkpoint: dict | None) -> Trainer:
    """Data, tokenizer, model and trainer, checked against the checkpoint when resuming."""
    train_corpus, valid_corpus = load_split(args, "train"), load_split(args, "valid")
    check_corpora(args, train_corpus, valid_corpus)
    fingerprint, valid_fingerprint = corpus_fingerprint(train_corpus), corpus_fingerprint(valid_corpus)
    if checkpoint is not None:
        check_same_data(args, checkpoint, fingerprint, valid_fingerprint)
    tokenizer = run_tokenizer(args, train_corpus, checkpoint)
    model = Transformer(preset(args.preset, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                               dropout=args.dropout))
    cfg = TrainConfig(lr=args.lr, warmup_steps=args.warmup, max_tokens=args.max_tokens, max_epochs=args.max_epochs,
                      max_steps=args.max_steps, update_freq=args.update_freq, seed=args.seed, patience=args.patience,
                      save_every=args.save_every, validate_every=args.validate_every)
    valid = encode_corpus(valid_corpus, tokenizer, max_len=source_limit(model, GenerationConfig(beam_size=1)))
    trainer = Trainer(model, tokenizer, encode_corpus(train_corpus, tokenizer, max_len=256), valid,
                      valid_corpus.target, cfg, device, args.out)
    trainer.run_info = {"options": run_options(args), "train_data": fingerprint, "valid_data": valid_fingerprint}
    if args.overwrite and distributed.is_main():
        for name in RUN_FILES:
            (Path(args.out) / name).unlink(missing_ok=True)
    if checkpoint is not None:
        resume(trainer, args)
    return trainer


def resume(trainer: Trainer, args) -> None:
    """Continue from --resume; a best.pt newer than the checkpoint's record (a kill between saves) is adopted."""
    trainer.resume(args.resume)
    on_disk = best_on_disk(Path(args.out))
    if on_disk and on_disk[0] > trainer.state.best_bleu:
        trainer.state.best_bleu, trainer.state.best_step = on_disk
    if distributed.is_main():
        print(f"resuming {args.resume} at step {trainer.state.step} (epoch {trainer.state.epoch + 1}); "
              f"stopping at max_epochs={args.max_epochs}, max_steps={args.max_steps or 'none'}")


def run_summary(trainer: Trainer, out: str) -> str:
    state = trainer.state
    if state.best_step < 0 and state.best_bleu < 0:
        return f"trained {state.step} steps; no validation ran; the model is in {Path(out) / 'last.pt'}"
    at = f" (step {state.best_step})" if state.best_step >= 0 else ""
    return f"best dev BLEU {state.best_bleu:.2f}{at}; checkpoints in {out}: best.pt to translate, last.pt to --resume"


# ---------------------------------------------------------------------------- translate and score

def takes_one_source(model) -> bool:
    return type(model).__name__ in ONE_SOURCE_MODELS


def read_inputs(paths: list[str]) -> list[list[str]]:
    """The --input files, line-aligned; empty lines are kept (they get an empty translation)."""
    columns = [read_lines(path) for path in paths]
    check_same_length(columns, paths)
    return columns


def translate(args) -> None:
    check_input_files(args.input, "--input")
    if Path(args.checkpoint).is_dir():
        raise MsgcoreError(f"--checkpoint {args.checkpoint} is a folder; give its best.pt")
    check_writable_file(args.output, "--output")
    device = resolve_device(args.device)
    cfg = GenerationConfig(beam_size=args.beam, len_penalty=args.len_penalty)
    model, tokenizer = load_model(args.checkpoint, device)
    if takes_one_source(model) and len(args.input) != 1:
        raise MsgcoreError(f"this checkpoint's model takes 1 source, not {len(args.input)}; give one --input file")
    columns = read_inputs(args.input)
    lines = [i for i in range(len(columns[0])) if any(column[i] for column in columns)]  # the non-empty lines
    corpus = Corpus("input", "input", tuple(f"src{k}" for k in range(len(columns))), "tgt",
                    [[column[i] for i in lines] for column in columns], [""] * len(lines))
    encoded = encode_corpus(corpus, tokenizer)
    limit = source_limit(model, cfg)
    cut = truncate_sources(encoded, limit, [i + 1 for i in lines])
    if cut:
        shown = ", ".join(map(str, cut[:10])) + (", ..." if len(cut) > 10 else "")
        print(f"warning: {len(cut)} input line(s) exceed what the model's {model.cfg.max_positions} positions allow "
              f"(line {shown}); translating their first {limit} pieces", file=sys.stderr)
    hyps = translate_encoded(model, tokenizer, encoded, device, cfg)
    outputs = [""] * len(columns[0])
    for i, hyp in zip(lines, hyps):
        outputs[i] = hyp
    with atomic_write(args.output) as f:
        f.writelines(h + "\n" for h in outputs)
    print(f"wrote {len(outputs)} translations to {args.output}")


def score(args) -> None:
    check_input_files([args.hyp], "--hyp")
    check_input_files([args.ref], "--ref")
    hyps, refs = read_lines(args.hyp), read_lines(args.ref)  # an empty hypothesis line is a legal output
    check_same_length([hyps, refs], [args.hyp, args.ref])
    if not refs:
        raise MsgcoreError(f"--hyp {args.hyp} and --ref {args.ref} are both empty; there is nothing to score")
    for result in score_all(hyps, refs, args.metrics, n_bootstrap=args.bootstrap).values():
        print(f"{result}\t{result.signature}")


# ---------------------------------------------------------------------------- parser

def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m msgcore", description=__doc__.splitlines()[0],
                           formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    add_train_options(commands.add_parser(
        "train", help="train a Transformer", formatter_class=HelpFormatter,
        description="Train a Transformer. Left-out training options take chapter 0's recipe for the preset "
                    f"(msgcore.experiments.cli_recipe; preset -> scale: {CLI_RECIPE_SCALES}). Writes OUT/best.pt "
                    "(best dev BLEU: give it to translate), OUT/last.pt (for --resume) and OUT/log.json."))
    add_translate_options(commands.add_parser(
        "translate", help="translate a file (one sentence a line)", formatter_class=HelpFormatter,
        description="Translate one sentence a line; an empty line gets an empty translation. Use the run's "
                    "best.pt (the checkpoint with the best dev BLEU); last.pt is the latest state, for --resume."))
    s = commands.add_parser("score", help="BLEU/chrF/TER of a hypothesis file against a reference file",
                            formatter_class=HelpFormatter)
    s.add_argument("--hyp", required=True, help="hypotheses, one a line")
    s.add_argument("--ref", required=True, help="references, line-aligned with --hyp")
    s.add_argument("--metrics", nargs="+", choices=["bleu", "chrf", "ter"], default=["bleu", "chrf", "ter"],
                   help="metrics to print")
    s.add_argument("--bootstrap", type=whole(0, 100_000), default=0, help="bootstrap samples for a 95%% CI (0 = none)")
    return parser


def add_train_options(t: argparse.ArgumentParser) -> None:
    t.add_argument("--dataset", choices=["multi30k", "ape", "mlqe-pe", "synthetic"], default="multi30k",
                   help="data set to train on (ignored with --train-files)")
    t.add_argument("--sources", nargs="+", default=["de"], help="source language(s)")
    t.add_argument("--target", default="en", help="target language")
    t.add_argument("--train-files", nargs="+", help="SRC... TGT plain-text files instead of --dataset")
    t.add_argument("--valid-files", nargs="+", help="SRC... TGT validation files (with --train-files)")
    t.add_argument("--skip-empty", action="store_true", help="drop examples with an empty line instead of refusing")
    t.add_argument("--preset", choices=sorted(PRESETS),
                   help=f"model size (default: {DEFAULT_PRESET}; on --resume, the checkpoint's)")
    t.add_argument("--vocab-size", type=whole(16, 1_000_000), help=recipe_help("vocab_size", "sentencepiece pieces"))
    t.add_argument("--spm-type", choices=["unigram", "bpe"],
                   help=f"sentencepiece model (default: {DEFAULT_SPM}; on --resume, the checkpoint's)")
    t.add_argument("--dropout", type=real(0, 1, high_open=True), help=recipe_help("dropout", "dropout"))
    t.add_argument("--lr", type=real(0, 1, low_open=True), help=recipe_help("lr", "peak learning rate"))
    t.add_argument("--warmup", type=whole(1), help=recipe_help("warmup", "warmup updates (then inverse sqrt decay)"))
    t.add_argument("--max-tokens", type=whole(1), help=recipe_help("max_tokens", "tokens per batch"))
    t.add_argument("--update-freq", type=whole(1), help="batches per update (gradient accumulation; default: 1; "
                                                         "on --resume, the checkpoint's)")
    t.add_argument("--max-epochs", type=whole(1), help=recipe_help("max_epochs", "stop after this many epochs"))
    t.add_argument("--max-steps", type=whole(0), default=0, help="stop after this many updates (0 = no limit); "
                                                                 "the last update is validated")
    t.add_argument("--patience", type=whole(0), help=recipe_help("patience", "stop after this many validations "
                                                                              "without a better dev BLEU (0 = never)"))
    t.add_argument("--validate-every", type=whole(0), default=0,
                   help="validate (dev loss and BLEU, best.pt) every N updates (0 = at the end of each epoch)")
    t.add_argument("--save-every", type=whole(0), default=0,
                   help="also write last.pt every N updates, so a kill loses at most N (0 = at validations only)")
    t.add_argument("--resume", help="checkpoint to continue from (OUT/last.pt); left-out options take its values")
    t.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    t.add_argument("--out", required=True, help="output folder for best.pt, last.pt and log.json")
    t.add_argument("--device", type=device_option, default="auto", help="auto (a GPU when visible), cpu, cuda:N")
    t.add_argument("--seed", type=seed_option,
                   help=f"random seed, 0 to 2^32-1 (default: {DEFAULT_SEED}; on --resume, the checkpoint's)")


def add_translate_options(x: argparse.ArgumentParser) -> None:
    x.add_argument("--checkpoint", required=True, help="a training run's best.pt")
    x.add_argument("--input", nargs="+", required=True, help="one file per source")
    x.add_argument("--output", required=True, help="where to write the translations (written whole, or not at all)")
    x.add_argument("--beam", type=whole(1, 256), default=5, help="beam size (1 = greedy)")
    x.add_argument("--len-penalty", type=real(0, 10), default=1.0, help="alpha in score / length^alpha")
    x.add_argument("--device", type=device_option, default="auto", help="auto (a GPU when visible), cpu, cuda:N")


# ---------------------------------------------------------------------------- entry point

def cli_wording(message: str) -> str:
    """A library message with its Python hints replaced by the command line's options."""
    for python_hint, cli_hint in CLI_WORDING.items():
        message = message.replace(python_hint, cli_hint)
    return message


def interrupted(args) -> str:
    last = Path(args.out) / "last.pt" if args.command == "train" else None
    if last is not None and last.is_file():
        return f"interrupted; resume with --resume {last}"
    return "interrupted; nothing was written" if last is None else "interrupted before the first checkpoint"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        {"train": train, "translate": translate, "score": score}[args.command](args)
    except MsgcoreError as error:
        print(f"error: {cli_wording(str(error))}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, an unreadable file, a path that is a folder: one line, no traceback
        print(f"error: {os_error_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted(args), file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
