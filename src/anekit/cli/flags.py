"""Typed, checked command-line values shared by the commands (argparse ``type=`` callables).

A value that does not parse, lies outside its range, or names nothing in the table it is looked up in
(``--config`` presets, ``--chip``, ``--route``) is a usage error: argparse's message naming the flag and
what it takes, exit status 2, found before any file is read or written. Ranges are named so that 0 or -1
is never silently taken for "the default"; names are checked by the table's own lookup, so the known
ones listed are always the table's. Defaults are shown in each flag's help.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from anekit.engine.chips import check_generation
from anekit.engine.chips import device as find_device
from anekit.engine.evidence import check_route
from anekit.errors import AnekitError
from anekit.kernels.config import preset as find_preset
from anekit.tools.config import HF_SEQ

WHERE = re.compile(r"^\[[^\]]*\] ")  # the "[layer] " an anekit message starts with
SEED_MAX = 2**32 - 1  # seeds are 32-bit unsigned everywhere anekit takes one (as numpy's legacy seeding)


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """A parser of integers in ``lo .. hi`` (both included)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo} .. {hi}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo} .. {hi}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_range(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """A parser of finite numbers in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``); NaN and inf are refused."""
    left = "(" if lo_open else "["
    span = f"{left}{lo:g}, {hi:g}]" if math.isfinite(hi) else f"{left}{lo:g}, inf)"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number in {span}, got {text!r}")
        if value < lo or (lo_open and value == lo) or value > hi:
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


seed = int_range(0, SEED_MAX)


def table_name(lookup: Callable[[str], object], what: str) -> Callable[[str], str]:
    """A parser of a name that ``lookup`` finds in its table (it raises an AnekitError naming the known
    ones otherwise); the name itself is the value."""

    def parse(text: str) -> str:
        try:
            lookup(text)
        except AnekitError as e:  # "[config] unknown preset 'x' (known: ...)": the flag says where
            raise argparse.ArgumentTypeError(WHERE.sub("", e.one_line())) from None
        return text

    parse.__name__ = what
    return parse


preset = table_name(find_preset, "preset")  # --config: a model preset


def model(text: str) -> str:
    """--config of the commands that build kernels: a preset, or a Hugging Face model directory."""
    from anekit.hf.config import is_model_dir

    if is_model_dir(text):
        return text
    return preset(text)


chip = table_name(check_generation, "chip")  # --chip: any, or a generation m1 .. m5
device = table_name(find_device, "device")  # --chip: a device of the chip table (m1 ... m5-max)
route = table_name(check_route, "route")  # --route: direct, e5rt or coreml


def preset_help(what: str, hf: bool = False) -> str:
    """Help text of a ``--config`` flag: what it is for and the presets' names (``hf``: or a Hugging
    Face model directory)."""
    from anekit.kernels.config import PRESETS

    more = f", or a Hugging Face model directory (windows of {HF_SEQ} tokens)" if hf else ""
    return f"{what}: one of {', '.join(PRESETS)}{more}"


def add_numerics(p: argparse.ArgumentParser, what: str) -> None:
    """``--chip``, ``--numerics`` and ``--sanitize``: the simulator's numeric profile and its sanitizer."""
    p.add_argument(
        "--chip",
        type=chip,
        metavar="CHIP",
        help="simulator: the chip whose numeric profile (and rules) to use, one of any, m1 .. m5 (default: "
        "this Mac's chip, else any = the conservative union of every chip)",
    )
    p.add_argument(
        "--numerics",
        choices=["engine", "exact", "ieee"],
        help="simulator: engine = the chip's measured numerics (default); exact = the same with the MAC's "
        "first-stage rounding modelled at training-kernel sizes too (up to 2^26 products; 4-6x slower); "
        "ieee = the ideal machine (fp16 storage, fp32 accumulation, exact functions)",
    )
    p.add_argument(
        "--sanitize",
        action="store_true",
        help=f"simulator: report, per op, where the chip's numerics depart from the ideal machine {what}",
    )


def numerics_options(args: argparse.Namespace) -> dict[str, object]:
    """The ``runtime.open`` options the numerics flags ask for (only those given)."""
    options: dict[str, object] = {}
    if args.chip is not None:
        options["chip"] = args.chip
    if args.numerics is not None:
        options["numerics"] = args.numerics
    if args.sanitize:
        options["sanitize"] = True
    return options
