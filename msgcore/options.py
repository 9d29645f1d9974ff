"""Option types shared by msgcore's command lines: ranges checked by argparse, errors as one line (exit 2)."""
from __future__ import annotations

import argparse
import math

from msgcore.utils import SEED_MAX, MsgcoreError, check_device


def whole(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high] (no upper bound when high is None)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range ({span(low, high)})")
        return value
    return parse


def real(low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number in the interval from low to high (open ends when asked)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        below = value <= low if low_open else value < low
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            bounds = f"{'>' if low_open else '>='} {low}" + (f" and {'<' if high_open else '<='} {high}" if high else "")
            raise argparse.ArgumentTypeError(f"{text} is out of range (a finite number {bounds})")
        return value
    return parse


def span(low: int, high: int | None) -> str:
    return f"{low} to {high}" if high is not None else f"at least {low}"


def device_option(text: str) -> str:
    """An argparse type: 'auto' or a device this machine has (cpu, cuda, cuda:N), checked before any work."""
    try:
        return check_device(text)
    except MsgcoreError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors as one line, "error: ...", exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

    def parse_or_exit_code(self, argv: list[str] | None = None) -> argparse.Namespace | int:
        """The parsed arguments, or the exit status a `main` returns instead: 0 after --help, 2 after a usage error
        (already printed as one line)."""
        try:
            return self.parse_args(argv)
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else 2


def seed_option(text: str) -> int:
    """An argparse type: a seed every generator accepts (0 to 2**32 - 1)."""
    return whole(0, SEED_MAX)(text)


def add_cap_options(parser: argparse.ArgumentParser) -> None:
    """--max-updates and --dry-run: the caps of `msgcore.dryrun`, for a command that trains chapters."""
    from msgcore import dryrun

    parser.add_argument("--max-updates", type=whole(1), metavar="N",
                        help="stop every training loop after N updates (its runs go to their own corner of the cache)")
    parser.add_argument("--dry-run", action="store_true",
                        help=f"cap every training loop at {dryrun.DRY_RUN[0]} updates and every data split at "
                             f"{dryrun.DRY_RUN[1]} sentences, at the recipe's model sizes: a check, not a result")


def apply_cap_options(args: argparse.Namespace) -> None:
    """Put the caps the options ask for in force (for this process and the ones it starts)."""
    from msgcore import dryrun

    updates, sentences = dryrun.DRY_RUN if args.dry_run else (0, 0)
    if args.max_updates:
        updates = min(updates, args.max_updates) if updates else args.max_updates
    if updates or sentences:
        dryrun.set_caps(updates, sentences)
