"""The extents the compiler accepts, per generation: tensor width, height and channels, rank, the fp16
convolution kernel width, the arg-min / arg-max axis — each a rule with its evidence.

The hardware task descriptor's fields are wider (15-bit spatial: 32767, 17-bit channels: 131071;
sbryngelson/ane-guide part-6-silicon/20-datapath-mac.md); the compiler's per-architecture parameter
tables bind first. The book measured them on a live M1 by sweeping (16384 compiles, 16385 rejects) and
by calling every per-architecture parameter constructor of the live compiler; ANEForge's cross-chip
sweep found the M1 row equal to the A14's. Where the limits come from the compiler they hold on both
compiled routes (``direct``, ``e5rt``).
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.chips import GENERATIONS
from anekit.engine.evidence import COMPILED, Evidence
from anekit.engine.rule import Rule
from anekit.engine.sources import (
    FORGE,
    GUIDE,
    GUIDE_CROSS_CHIP,
    GUIDE_MATRIX,
    GUIDE_PITFALLS,
    GUIDE_RULES,
    GUIDE_SURFACE,
)

LIMITS = f"{GUIDE_MATRIX}, 'Per-chip numeric limits'"
SHAPE_SWEEP = f"{GUIDE_RULES}, 'Shape and rank limits'"
HAL_TABLE = f"{GUIDE} part-7-toolchain/24-hal-gates.md, per-family scalar matrix (max_tensor_width 0x138)"


@dataclass(frozen=True)
class Extent:
    """The largest value of one extent on each generation."""

    rule: str
    limits: dict[str, int]

    def limit(self, chip: str) -> int:
        """The limit on ``chip``; for "any", the smallest of every generation's."""
        return min(self.limits.values()) if chip not in self.limits else self.limits[chip]

    def broken_on(self, value: int) -> tuple[str, ...]:
        """The generations whose limit ``value`` exceeds."""
        return tuple(c for c in GENERATIONS if value > self.limits[c])


SPATIAL = Extent("extent.spatial", {"m1": 16384, "m2": 16384, "m3": 16384, "m4": 65536, "m5": 65536})
CHANNELS = Extent("extent.channels", dict.fromkeys(GENERATIONS, 65536))
RANK = Extent("extent.rank", dict.fromkeys(GENERATIONS, 5))
ARG_AXIS = Extent("extent.arg-axis", dict.fromkeys(GENERATIONS, 2048))
# fp16 convolution kernel width (the "large" kernel format): M1 measured 13, M5 measured 15; the M2 and M3
# take the decompiled table's 16, the M4 the M5's 15 (the book's chapter 12: "13 -> 15 at A16").
CONV_KERNEL_WIDTH_FP16 = Extent(
    "extent.conv-kernel-width", {"m1": 13, "m2": 16, "m3": 16, "m4": 15, "m5": 15}
)
CONV_KERNEL_WIDTH = Extent("extent.conv-kernel-width", {"m1": 29, "m2": 32, "m3": 32, "m4": 32, "m5": 32})

EXTENT_RULES: tuple[Rule, ...] = (
    Rule(
        "extent.spatial",
        "Tensor width and height (the last two dimensions) are at most 16384 on M1 through M3 and 65536 on "
        "M4 and M5.",
        "tensor",
        "refused",
        (
            Evidence(
                SHAPE_SWEEP,
                "measured",
                "'Width 16384 compiles and 16385 rejects, and the same one-element step holds for height'",
                ("m1",),
                COMPILED,
            ),
            Evidence(
                f"{GUIDE_CROSS_CHIP} (M2 spatial and contraction extent cap)",
                "measured",
                "16384 on the M2",
                ("m2",),
                COMPILED,
            ),
            Evidence(
                f"{FORGE} docs/cross-chip.md",
                "measured",
                "'The A13 row is now measured on the live M1 and equals A14 exactly (16385 W/H, 65537 C "
                "both reject)'",
                ("m1",),
                COMPILED,
            ),
            Evidence(
                f"{LIMITS}; {HAL_TABLE}",
                "decompile-derived",
                "max tensor W / H 16384 for A13 to A15, 65536 for A16 and the M5 (parameter tables read from "
                "the live compiler)",
                ("m3", "m4", "m5"),
                COMPILED,
            ),
        ),
    ),
    Rule(
        "extent.channels",
        "The channel axis is at most 65536 on every generation.",
        "tensor",
        "refused",
        (
            Evidence(
                SHAPE_SWEEP,
                "measured",
                "'Channel axis | 65536 | 65537 rejects at compile'",
                ("m1",),
                COMPILED,
            ),
            Evidence(
                f"{GUIDE_CROSS_CHIP}",
                "measured",
                "'the channel axis caps at 65536, exactly four times the spatial cap' (M2)",
                ("m2",),
                COMPILED,
            ),
            Evidence(LIMITS, "decompile-derived", "max tensor C 65536 on every tier", routes=COMPILED),
        ),
    ),
    Rule(
        "extent.rank",
        "No tensor of a program has rank above 5.",
        "tensor",
        "refused",
        (
            Evidence(
                f"{GUIDE_SURFACE}, 'Reference: the per-chip shape limits'",
                "measured",
                "'the frontend rejects a graph that builds a rank-6 tensor' ('tensor rank 6 exceeds the ANE "
                "maximum of 5')",
                ("m1",),
                COMPILED,
            ),
        ),
    ),
    Rule(
        "extent.arg-axis",
        "reduce_argmax and reduce_argmin reduce an axis of at most 2048 elements (fp16-encoded indices).",
        "op",
        "refused",
        (
            Evidence(
                SHAPE_SWEEP,
                "measured",
                "'This 2048 limit is independent of the 16384 and 65536 tensor bounds and applies to the "
                "reduction axis alone' (2049 rejects)",
                ("m1",),
                COMPILED,
            ),
        ),
    ),
    Rule(
        "extent.conv-kernel-width",
        "A convolution kernel is at most 13 wide in fp16 on the M1 (29 in other formats), 15 on M4 and M5, "
        "16 on M2 and M3 (32 in other formats).",
        "op",
        "refused",
        (
            Evidence(
                SHAPE_SWEEP,
                "measured",
                "'On the M1 the fp16 convolution kernel width is bounded at 13: a kernel of width 14 "
                "rejects'; 'a 16x3 kernel compiles and a 3x16 kernel does not'",
                ("m1",),
                COMPILED,
            ),
            Evidence(
                f"{FORGE} docs/developer/capabilities-and-targets.md, 'conv_kernel_ge16'",
                "measured",
                "'conv ... is capped at kernel K<=15 on M5: a 1xK kernel with K>=16 fails ANECCompile'",
                ("m5",),
                COMPILED,
            ),
            Evidence(
                LIMITS,
                "decompile-derived",
                "max kernel W (fp16, large): 13 on A13, 16 on A14 to A16; (default format) 29 and 32",
                ("m2", "m3"),
                COMPILED,
            ),
            Evidence(
                f"{GUIDE_CROSS_CHIP}",
                "predicted",
                "the fp16 kernel width goes from 13 to 15 at A16 (the M4 takes the A16 limits)",
                ("m4",),
                COMPILED,
            ),
        ),
        decision="The decompiled table says 16 for A16 while the M5 measured 15: the measurement wins on the "
        "M5, and the M4 (A16 limits) follows it.",
    ),
    Rule(
        "op.matmul-depth",
        "matmul takes operands whose depth axis (the third dimension from the end of a rank-5 tensor) is 1: "
        "a rank-5 batched matmul is rejected on the device.",
        "op",
        "refused",
        (
            Evidence(
                f"{GUIDE_SURFACE}; {GUIDE_RULES}",
                "measured",
                "'The matrix-multiply operation requires the depth axis to be 1 on both operands' "
                "('depth > 1 is not supported for MatMult')",
                ("m1",),
                COMPILED,
            ),
        ),
    ),
    Rule(
        "op.dynamic-conv-batch-m1",
        "On the M1 a convolution whose weight is computed or fed at run time (not a constant) compiles only "
        "at batch 1: at batch 2 or more the compiler service crashes.",
        "op",
        "refused",
        (
            Evidence(
                f"{GUIDE_PITFALLS}, 'Dynamic-weight convolution above batch one'",
                "measured",
                "'At a batch of two or more the same program crashes the compiler service' ... 'batch one "
                "passes, batch two fails, every time'",
                ("m1",),
                COMPILED,
            ),
            Evidence(
                f"{FORGE} docs/capabilities.md",
                "reported",
                "'Reachable and correct at batch 1 only; batch >= 2 does not compile'",
                ("m1",),
                COMPILED,
            ),
        ),
        chips=("m1",),
    ),
)

EXTENTS: dict[str, Extent] = {e.rule: e for e in (SPATIAL, CHANNELS, RANK, ARG_AXIS)}
