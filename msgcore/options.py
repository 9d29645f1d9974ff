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


def seed_option(text: str) -> int:
    """An argparse type: a seed every generator accepts (0 to 2**32 - 1)."""
    return whole(0, SEED_MAX)(text)
