"""The links between Macs a distributed run can use, as data: each link's rate and latency with the evidence
they rest on (``anekit.engine.evidence``), and what others measured of data parallelism on Macs.

A rate is what one sender moves to one receiver over the link (a stream's payload, both ends' stacks
included), the figure the chain of ``anekit.cost.distributed`` needs: every hop of it is one rank sending to
the next. A latency is one way, per message. Where the public record has no figure for a link, a stated
assumption stands in with status ``assumed`` and says so. Figures measured between non-Macs, or on an older
Thunderbolt than the link's, say which in what they observed.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.engine.evidence import Evidence
from anekit.engine.performance import Figure
from anekit.errors import AnekitError

GB = 1e9  # rates are in decimal gigabytes per second (a link's Gbit/s / 8)


@dataclass(frozen=True)
class Link:
    """One kind of link between two Macs, as a sender on one end sees it."""

    name: str  # the short name `--link` takes
    label: str
    transport: str  # what carries the gradients over it: the transport anekit would use
    engine: str  # anekit's transport over it (``--distributed``): "mpi" or "mlx"
    rate: Figure  # GB/s, one sender to one receiver
    latency: Figure  # microseconds, one way, per message

    @property
    def bytes_per_s(self) -> float:
        return self.rate.value * GB

    @property
    def latency_s(self) -> float:
        return self.latency.value * 1e-6


ETHERNET = Link(
    name="10gbe",
    label="10 Gigabit Ethernet",
    transport="MPI (TCP) or mlx ring",
    engine="mpi",
    rate=Figure(
        1.19,
        "GB/s",
        Evidence(
            "esnet/iperf issue #123 (iperf 2.0.5 vs iperf3 on 10G Ethernet)",
            "measured",
            "iperf 2.0.5 saturates a back-to-back 10G link at 9.5-9.9 Gbps (two 16-core Linux hosts, not "
            "Macs); the lower figure, 9.5 Gbit/s, is taken",
        ),
        also=(
            Evidence(
                "IEEE 802.3ae (10 Gigabit Ethernet)", "rated", "10 Gbit/s line rate: 1.25 GB/s before framing"
            ),
        ),
    ),
    latency=Figure(
        50.0,
        "us",
        Evidence(
            "none found",
            "assumed",
            "no one-way latency of TCP between Macs over 10 GbE was found in the public record; 50 us (a "
            "switch hop and both ends' TCP stacks) is assumed",
        ),
    ),
)

THUNDERBOLT_TCP = Link(
    name="tb-tcp",
    label="Thunderbolt, IP over Thunderbolt Bridge (TCP)",
    transport="MPI (TCP) or mlx ring",
    engine="mpi",
    rate=Figure(
        2.5,
        "GB/s",
        Evidence(
            "swellweb/targetBridge issue #110 (comment of 2026-07-23)",
            "measured",
            "about 20 Gbit/s of TCP between two Macs over a Thunderbolt 5 cable on an iMac's Thunderbolt 3 "
            "port (40 Gbit/s), with TargetBridge's cable test; no TCP figure between two Thunderbolt 5 ports "
            "was found, so Thunderbolt 5 is taken as this",
        ),
        also=(
            Evidence(
                "swellweb/targetBridge pull request #17",
                "reported",
                "'the cable rating is 40Gb/s for TB3, but one can only expect about half of that for TCP'",
            ),
            Evidence(
                "jiribrejcha.net, 'Direct 20 Gbps connection between Mac and Windows 11 machine'",
                "measured",
                "iperf3: 16.4 Gbit/s of TCP from a MacBook Pro M2 to a PC over a USB4 20/20 Gbit/s link, "
                "5.3 Gbit/s the other way at the Mac's default MTU of 1500",
            ),
        ),
    ),
    latency=Figure(
        190.0,
        "us",
        Evidence(
            "exo-explore/exo issue #2295",
            "measured",
            "round trip over the Thunderbolt bridge 0.38-0.95 ms between four Mac Studio M3 Ultras during a "
            "pipeline-parallel run; half the lowest round trip is taken as one way",
        ),
    ),
)

THUNDERBOLT_RDMA = Link(
    name="tb5-rdma",
    label="Thunderbolt 5 RDMA (mlx's JACCL, macOS 26.2+)",
    transport="mlx (JACCL)",
    engine="mlx",
    rate=Figure(
        9.38,
        "GB/s",
        Evidence(
            "hellas-ai/thunderbolt-ibverbs pull request #27",
            "measured",
            "ib_send_bw with 64 KiB messages between two Macs' Thunderbolt 5 RDMA ports: 75.00 Gbit/s "
            "one way (68.93 the other)",
            macos="26.2",
        ),
        also=(
            Evidence(
                "ml-explore/mlx pull request #3412 (JACCL refactor)",
                "measured",
                "JACCL all-reduce of 256 MB: ~9 GB/s algorithm bandwidth before its bf16 reduction was "
                "compiled for armv8.6-a, 12.2 GB/s after (bf16)",
            ),
            Evidence(
                "pytorch/pytorch pull request #189856 (TCCL)",
                "measured",
                "a collective library over Thunderbolt 5 RDMA modelled on JACCL: ~7.6 GB/s per rank of "
                "effective bandwidth in fp32",
            ),
            Evidence(
                "ml-explore/mlx pull request #3094 (JACCL update)",
                "measured",
                "the bandwidth of JACCL's ring and mesh across 4 M3 Ultras, as a plot (no figure in "
                "its text)",
            ),
        ),
    ),
    latency=Figure(
        4.64,
        "us",
        Evidence(
            "hellas-ai/thunderbolt-ibverbs pull request #27",
            "measured",
            "ib_send_lat with 4096-byte messages: 4.64 us on average (p99 5.96 us)",
            macos="26.2",
        ),
    ),
)

LINKS: dict[str, Link] = {link.name: link for link in (ETHERNET, THUNDERBOLT_TCP, THUNDERBOLT_RDMA)}


def link(name: str) -> Link:
    """The link called ``name``; one line naming the known ones otherwise."""
    try:
        return LINKS[name]
    except KeyError:
        raise AnekitError(f"[cost] unknown link '{name}' (known: {', '.join(LINKS)})") from None


# What others saw of more Macs on one job: context for the model, not figures it uses. Data-parallel
# training figures measured on Macs are few; what each one is, is said.
REPORTS: tuple[Evidence, ...] = (
    Evidence(
        "akaszubski/realign issue #45",
        "reported",
        "'38.7% speedup with 2 devices (based on benchmarks)': data-parallel training with MLX over MPI "
        "(MLX-DISTRIBUTED-TRAINING's figure, quoted; its setup is not given)",
    ),
    Evidence(
        "exo-explore/exo issue #1293",
        "reported",
        "'a two node cluster provides about 1.8x the effective compute, and a four node cluster provides "
        "about 3.2x': a user's expectation for inference over Thunderbolt RDMA, not a measurement",
    ),
    Evidence(
        "Apple WWDC26 session 233, 'Explore distributed inference and training with MLX'",
        "reported",
        "four M3 Ultras over Thunderbolt 5 RDMA: inference 'nearly three times' one Mac (as summarised by "
        "rotecodefraktion.de); distributed LoRA fine-tuning shown with mlx_lm.lora, no speed-up figure found",
    ),
    Evidence(
        "ml-explore/mlx docs, examples/data_parallelism",
        "reference",
        "MLX's data parallelism: gradients averaged with all_sum (mlx.nn.average_gradients groups arrays "
        "into 32 MiB all-reduces); the order of the sum is the backend's",
    ),
)
