"""Command line: `python -m msgcore {train,translate,score}`; `python -m msgcore CMD --help` for options.

    python -m msgcore train --dataset multi30k --sources de --target en --out runs/de-en
    python -m msgcore translate --checkpoint runs/de-en/best.pt --input test.de --output hyp.en
    python -m msgcore score --hyp hyp.en --ref test.en --metrics bleu chrf ter
    torchrun --nproc_per_node=4 -m msgcore train ...       # data-parallel on 4 GPUs (msgcore.distributed)
"""
from __future__ import annotations

import argparse
import sys

from msgcore import distributed
from msgcore.batching import encode_corpus
from msgcore.data import (Corpus, check_same_length, load_ape, load_mlqe_pe, load_multi30k, read_lines, read_parallel,
                          synthetic_corpus)
from msgcore.generation import GenerationConfig
from msgcore.metrics import score_all
from msgcore.model import PRESETS, Transformer, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, TrainConfig, load_model, translate_encoded
from msgcore.utils import MsgcoreError, atomic_write, resolve_device, seed_everything


def load_split(args, split: str) -> Corpus:
    """The training or validation corpus named on the command line."""
    if args.train_files:
        files = args.train_files if split == "train" else args.valid_files
        columns = read_parallel(files)
        langs = tuple(f"src{k}" for k in range(len(files) - 1))
        return Corpus("files", split, langs, "tgt", columns[:-1], columns[-1])
    if args.dataset == "multi30k":
        return load_multi30k("train" if split == "train" else "val", sources=args.sources, target=args.target)
    if args.dataset == "ape":
        return load_ape("train" if split == "train" else "dev")
    if args.dataset == "mlqe-pe":
        return load_mlqe_pe("train" if split == "train" else "dev")
    return synthetic_corpus(3000 if split == "train" else 200, num_sources=len(args.sources), seed=args.seed,
                            split="train" if split == "train" else "val")


def train(args) -> None:
    """Train a Transformer; under torchrun, one data-parallel process per GPU (or CPU worker)."""
    seed_everything(args.seed)
    if distributed.launched():
        device = distributed.device_for_rank(args.device)
        distributed.init(device)
    else:
        device = resolve_device(args.device)
    train_corpus, valid_corpus = load_split(args, "train"), load_split(args, "valid")
    if train_corpus.num_sources != 1:
        raise MsgcoreError(f"the Transformer takes 1 source, the data has {train_corpus.num_sources}")
    tokenizer = Tokenizer.train(train_corpus.texts(), vocab_size=args.vocab_size, model_type=args.spm_type,
                                seed=args.seed)
    overrides = {} if args.dropout is None else {"dropout": args.dropout}
    model = Transformer(preset(args.preset, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **overrides))
    cfg = TrainConfig(lr=args.lr, warmup_steps=args.warmup, max_tokens=args.max_tokens, max_epochs=args.max_epochs,
                      max_steps=args.max_steps, update_freq=args.update_freq, seed=args.seed)
    trainer = Trainer(model, tokenizer, encode_corpus(train_corpus, tokenizer, max_len=256),
                      encode_corpus(valid_corpus, tokenizer), valid_corpus.target, cfg, device, args.out)
    if args.resume:
        trainer.resume(args.resume)
    main_process = distributed.is_main()
    try:
        trainer.train()
    finally:
        distributed.shutdown()
    if main_process:
        print(f"best dev BLEU {trainer.state.best_bleu:.2f}; checkpoints in {args.out}")


def translate(args) -> None:
    device = resolve_device(args.device)
    model, tokenizer = load_model(args.checkpoint, device)
    columns = read_parallel(args.input)
    corpus = Corpus("input", "input", tuple(f"src{k}" for k in range(len(columns))), "tgt", columns,
                    [""] * len(columns[0]))
    encoded = encode_corpus(corpus, tokenizer)
    cfg = GenerationConfig(beam_size=args.beam, len_penalty=args.len_penalty)
    hyps = translate_encoded(model, tokenizer, encoded, device, cfg)
    with atomic_write(args.output) as f:
        f.writelines(h + "\n" for h in hyps)
    print(f"wrote {len(hyps)} translations to {args.output}")


def score(args) -> None:
    hyps, refs = read_lines(args.hyp), read_lines(args.ref)  # an empty hypothesis line is a legal output
    check_same_length([hyps, refs], [args.hyp, args.ref])
    for result in score_all(hyps, refs, args.metrics, n_bootstrap=args.bootstrap).values():
        print(f"{result}\t{result.signature}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m msgcore", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train", help="train a Transformer")
    t.add_argument("--dataset", choices=["multi30k", "ape", "mlqe-pe", "synthetic"], default="multi30k")
    t.add_argument("--sources", nargs="+", default=["de"], help="source language(s)")
    t.add_argument("--target", default="en")
    t.add_argument("--train-files", nargs="+", help="SRC... TGT plain-text files instead of --dataset")
    t.add_argument("--valid-files", nargs="+", help="SRC... TGT validation files (with --train-files)")
    t.add_argument("--preset", choices=sorted(PRESETS), default="small")
    t.add_argument("--vocab-size", type=int, default=8000)
    t.add_argument("--dropout", type=float, help="dropout (default: the preset's)")
    t.add_argument("--spm-type", choices=["unigram", "bpe"], default="unigram")
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--warmup", type=int, default=1000)
    t.add_argument("--max-tokens", type=int, default=4096)
    t.add_argument("--update-freq", type=int, default=1)
    t.add_argument("--max-epochs", type=int, default=10)
    t.add_argument("--max-steps", type=int, default=0)
    t.add_argument("--resume", help="checkpoint to continue from")
    t.add_argument("--out", required=True, help="output folder for checkpoints and log.json")
    x = commands.add_parser("translate", help="translate a file (one sentence a line)")
    x.add_argument("--checkpoint", required=True)
    x.add_argument("--input", nargs="+", required=True, help="one file per source")
    x.add_argument("--output", required=True)
    x.add_argument("--beam", type=int, default=5)
    x.add_argument("--len-penalty", type=float, default=1.0)
    s = commands.add_parser("score", help="BLEU/chrF/TER of a hypothesis file against a reference file")
    s.add_argument("--hyp", required=True)
    s.add_argument("--ref", required=True)
    s.add_argument("--metrics", nargs="+", choices=["bleu", "chrf", "ter"], default=["bleu", "chrf", "ter"])
    s.add_argument("--bootstrap", type=int, default=0, help="bootstrap samples for a 95%% CI (0 = none)")
    for sub in (t, x):
        sub.add_argument("--device", default="auto")
    t.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train" and bool(args.train_files) != bool(args.valid_files):
        print("error: --train-files and --valid-files go together", file=sys.stderr)
        return 2
    try:
        {"train": train, "translate": translate, "score": score}[args.command](args)
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
