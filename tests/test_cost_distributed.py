"""The data-parallel cost model against figures worked out by hand in float64, the gradient sizes against
the real parameter and adapter containers, and the link table's records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from anekit.cost import distributed as d
from anekit.cost.links import LINKS, REPORTS, Link, link
from anekit.engine.evidence import Evidence
from anekit.engine.performance import Figure
from anekit.errors import AnekitError
from anekit.kernels.config import preset
from anekit.llama.params import Params
from anekit.training.lora import Adapters, LoraSpec


def _link(gb_per_s: float, latency_us: float, engine: str = "mpi") -> Link:
    ev = Evidence("a test", "assumed", "a round figure for hand computation")
    return Link("test", "test", "none", engine, Figure(gb_per_s, "GB/s", ev), Figure(latency_us, "us", ev))


ONE_GB = _link(1.0, 10.0)  # 1 GB/s, 10 us
NO_LATENCY = _link(1.0, 1e-9)  # latency negligible: a hop of b bytes is b ns


def test_a_hop_is_latency_plus_bytes_over_rate() -> None:
    assert d.hop_s(1e6, ONE_GB) == pytest.approx(10e-6 + 1e-3, rel=1e-12)


def test_the_chain_is_pipelined_over_buckets_with_blocking_transfers() -> None:
    # 3 ranks, buckets of 1, 2, 1 ms; a transfer holds both its ranks. Rank 0 -> 1 at 0-1, 2-4 (rank 1 was
    # sending bucket 0 until 2), 6-7; rank 1 -> 2 at 1-2, 4-6, 7-8 ms.
    assert d.chain_s([1e6, 2e6, 1e6], 3, NO_LATENCY) == pytest.approx(8e-3, rel=1e-6)
    # equal buckets past 2 ranks: (ranks - 1) + 2 (buckets - 1) transfers: 4 buckets over 4 ranks, 9 of 1 ms
    assert d.chain_s([1e6] * 4, 4, NO_LATENCY) == pytest.approx(9e-3, rel=1e-6)
    assert d.chain_s([1e6] * 4, 2, NO_LATENCY) == pytest.approx(4e-3, rel=1e-6)  # 2 ranks: back to back
    # one bucket: ranks - 1 transfers, each with its latency
    assert d.chain_s([1e6], 5, ONE_GB) == pytest.approx(4 * (10e-6 + 1e-3), rel=1e-12)
    assert d.chain_s([1e6], 1, ONE_GB) == 0.0


def test_a_rank_adds_its_buffers_before_it_takes_the_next_bucket() -> None:
    # 2 ranks, 3 buckets of 1 ms; rank 1 adds 2 buffers of 1 MB at 6 GB/s: 3 x 2 MB / 6 GB/s = 1 ms a bucket
    assert d.chain_s([1e6] * 3, 2, NO_LATENCY, adds=2, memory_rate=6e9) == pytest.approx(6e-3, rel=1e-6)
    assert d.chain_s([1e6] * 3, 2, NO_LATENCY, adds=2) == pytest.approx(3e-3, rel=1e-6)  # not priced


def test_overlapped_links_and_adds_pipeline_the_buckets() -> None:
    # 3 ranks, buckets of 1, 2, 1 ms, each link direction and each rank's adds separate: rank 0 -> 1 at
    # 0-1, 1-3, 3-4; rank 1 -> 2 at 1-2, 3-5, 5-6 ms
    assert d.chain_s([1e6, 2e6, 1e6], 3, NO_LATENCY, overlap=True) == pytest.approx(6e-3, rel=1e-6)
    # 2 ranks, 1 ms transfers, 1 ms of adds: bucket j arrives at j + 1 and is added by j + 2 ms
    kw = {"adds": 2, "memory_rate": 6e9, "overlap": True}
    assert d.chain_s([1e6] * 3, 2, NO_LATENCY, **kw) == pytest.approx(4e-3, rel=1e-6)
    # adds of 2 ms outrun the wire: 1 ms for the first transfer, then 3 x 2 ms of adds
    kw["memory_rate"] = 3e9
    assert d.chain_s([1e6] * 3, 2, NO_LATENCY, **kw) == pytest.approx(7e-3, rel=1e-6)
    assert d.chain_s([1e6] * 3, 2, NO_LATENCY, adds=2, memory_rate=3e9) == pytest.approx(9e-3, rel=1e-6)


def test_the_broadcast_is_the_transports_star_or_relay() -> None:
    # MPI: the root sends to the 3 others in turn: 10 us + 3 x 1 ms
    assert d.broadcast_s(1e6, 4, ONE_GB) == pytest.approx(10e-6 + 3e-3, rel=1e-12)
    assert d.broadcast_s(1e6, 2, ONE_GB) == pytest.approx(10e-6 + 1e-3, rel=1e-12)  # one send
    assert d.broadcast_s(1e6, 1, ONE_GB) == 0.0
    # mlx: a relay along the ring, passed on in 16 MiB pieces: 100 MB over 4 ranks is 3 latencies, the
    # 100 MB once and 2 more pieces of 16 MiB; a 1 MB bucket is 3 latencies and 3 times itself
    ring = _link(1.0, 10.0, "mlx")
    want = 3 * 10e-6 + (100e6 + 2 * (16 << 20)) / 1e9
    assert d.broadcast_s(100e6, 4, ring) == pytest.approx(want, rel=1e-12)
    assert d.broadcast_s(1e6, 4, ring) == pytest.approx(3 * 10e-6 + 3e-3, rel=1e-12)
    assert d.broadcast_s(1e6, 2, ring) == pytest.approx(10e-6 + 1e-3, rel=1e-12)


def test_an_exchange_is_the_chain_then_one_broadcast_of_the_total() -> None:
    e = d.exchange([1_000_000, 3_000_000], 4, ONE_GB)
    # transfers of 1.01 and 3.01 ms: bucket 0 reaches ranks 1, 2, 3 at 1.01, 2.02, 3.03 ms; bucket 1 leaves
    # rank 0 when rank 1 is done sending bucket 0 (2.02) and reaches ranks 1, 2, 3 at 5.03, 8.04, 11.05 ms
    assert e.chain_s == pytest.approx(11.05e-3, rel=1e-9)
    assert e.broadcast_s == pytest.approx(10e-6 + 3 * 4e-3, rel=1e-9)  # the 4 MB, once, to each of 3
    assert (e.nbytes, e.buckets, e.ranks) == (4_000_000, 2, 4)
    assert e.total_s == pytest.approx(11.05e-3 + 12.01e-3, rel=1e-9)


def test_the_speedup_is_one_mac_over_the_step() -> None:
    # 2 ranks x 4 sequences of 0.1 s, update 0.02 s, 100 MB at 1 GB/s: chain 0.1 s, broadcast 0.1 s
    s = d.scaling(2, 4, 0.1, [100_000_000], NO_LATENCY, update_s=0.02)
    assert s.exchange.total_s == pytest.approx(0.2, rel=1e-6)
    assert s.step_s == pytest.approx(0.62, rel=1e-6)
    assert s.one_mac_s == pytest.approx(0.82, rel=1e-12)
    assert s.speedup == pytest.approx(0.82 / 0.62, rel=1e-6)
    assert s.exchange_share == pytest.approx(0.2 / 0.62, rel=1e-6)
    # rank 1 adds its 4 buffers of 100 MB at 12 GB/s: 3 x 400 MB / 12 GB/s = 0.1 s more
    added = d.scaling(2, 4, 0.1, [100_000_000], NO_LATENCY, update_s=0.02, memory_rate=12e9)
    assert added.exchange.chain_s == pytest.approx(0.2, rel=1e-6)
    assert added.speedup == pytest.approx(0.82 / 0.72, rel=1e-6)
    alone = d.scaling(1, 4, 0.1, [100_000_000], NO_LATENCY, update_s=0.02)
    assert alone.exchange.total_s == 0.0 and alone.speedup == 1.0


def test_the_accumulation_that_hides_the_exchange() -> None:
    # X = 0.2 s, t = 0.1 s, u = 0.02 s: k >= (9 * 0.2 - 0.02) / 0.1 = 17.8 -> 18
    assert d.accum_to_hide(2, 0.1, [100_000_000], NO_LATENCY, update_s=0.02) == 18
    # near the boundary: u = 0, k = 9 * 0.2 / 0.1 = 18 but for the 2e-15 s of latency: 19, the least k
    # whose exchange is at most 10% of the step
    k = d.accum_to_hide(2, 0.1, [100_000_000], NO_LATENCY)
    assert k == 19
    assert d.scaling(2, k, 0.1, [100_000_000], NO_LATENCY).exchange_share <= 0.1 + 1e-12
    assert d.scaling(2, k - 1, 0.1, [100_000_000], NO_LATENCY).exchange_share > 0.1
    assert d.accum_to_hide(2, 0.15, [100_000_000], NO_LATENCY, share=0.5) == 2  # X <= k t: k >= 1.33
    assert d.accum_to_hide(1, 0.1, [100_000_000], NO_LATENCY) == 1
    # adds of 0.01 s per sequence (3 x 100 MB / 30 GB/s): X(k) = 0.2 + 0.01 k <= 0.1 (0.1 k + 0.025 + X(k))
    # for 0.001 k >= 0.1775: k = 178
    assert d.accum_to_hide(2, 0.1, [100_000_000], NO_LATENCY, update_s=0.025, memory_rate=30e9) == 178
    # adds of 0.1 s per sequence (3 GB/s): the exchange grows as fast as the compute, never hidden
    assert d.accum_to_hide(2, 0.1, [100_000_000], NO_LATENCY, memory_rate=3e9) is None


def test_full_training_buckets_are_the_parameters_in_file_order() -> None:
    # stories15M by hand: embedding 32000 x 288; per layer two norms of 288, four 288 x 288 projections,
    # three 768 x 288 FFN matrices; the final norm; tied classifier.
    per_layer = 2 * 288 + 4 * 288 * 288 + 3 * 768 * 288
    buckets = d.full_buckets(preset("stories15M"))
    assert sum(buckets) == 4 * (32000 * 288 + 6 * per_layer + 288) == 4 * 15_191_712
    assert len(buckets) == 1 + 9 * 6 + 1
    assert sum(d.full_buckets(preset("stories15M"), wire="bf16")) == 2 * 15_191_712
    cfg = preset("default")
    for tied in (True, False):
        real = [a.nbytes for _, a in Params.init(cfg, tied=tied).tensors()]  # float32 arrays, in order
        assert list(d.full_buckets(cfg, tied=tied)) == real


def test_lora_buckets_are_the_adapter_factors() -> None:
    # SmolLM2-135M's shapes, rank 8 on q (576 x 576) and v (192 x 576): per layer 8*576 + 576*8 + 8*576 +
    # 192*8 = 15360 values, over 30 layers
    cfg = preset("default").with_(dim=576, hidden_dim=1536, n_layers=30, n_heads=9, n_kv_heads=3)
    assert sum(d.lora_buckets(cfg, 8)) == 4 * 30 * 15360 == 1_843_200
    small = preset("default")
    spec = LoraSpec(rank=4, alpha=8.0, targets=("q", "v", "down"))
    adapters = Adapters.init(spec, small, np.random.default_rng(0))
    real = []
    for key in adapters.matrices():
        real += [adapters.a[key].nbytes, adapters.b[key].nbytes]
    assert list(d.lora_buckets(small, 4, ("down", "q", "v"))) == real


def test_pack_groups_consecutive_tensors_without_splitting() -> None:
    assert d.pack([10, 20, 5, 40, 1], 30) == (30, 45, 1)
    assert d.pack([100], 30) == (100,)
    assert sum(d.pack(d.full_buckets(preset("stories15M")), 1 << 20)) == 4 * 15_191_712
    assert d.split([10, 25, 3], 10) == (10, 10, 10, 5, 3)
    assert d.rebucket([25, 1, 2, 3, 4], 10) == (10, 10, 11, 4)  # 10, 10, 5 + 1 + 2 + 3, 4
    assert sum(d.rebucket(d.full_buckets(preset("stories15M")), 1 << 20)) == 4 * 15_191_712


def test_the_predicted_sequence_is_the_cost_reports_engine_time() -> None:
    from anekit.cost import fitted
    from anekit.tools.cost_report import report, step

    cfg = preset("stories15M")
    kernels, what = step(cfg, "baked")
    doc = report(kernels, what, "m4", "direct", fitted(), cfg)
    assert d.sequence_s(cfg, "m4") * 1e3 == pytest.approx(doc["engine_ms"], rel=1e-9)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: d.exchange([1000], 0, ONE_GB), "ranks must be an integer >= 1"),
        (lambda: d.exchange([], 2, ONE_GB), "buckets must be a non-empty"),
        (lambda: d.scaling(2, 0, 0.1, [1000], ONE_GB), "accumulation must be an integer >= 1"),
        (lambda: d.scaling(2, 1, -1.0, [1000], ONE_GB), "sequence time must be > 0"),
        (lambda: d.scaling(2, 1, math.nan, [1000], ONE_GB), "sequence time must be > 0"),
        (lambda: d.accum_to_hide(2, 0.1, [1000], ONE_GB, update_s=-1), "update time must be >= 0"),
        (lambda: d.accum_to_hide(2, 0.1, [1000], ONE_GB, share=1.0), "share must be between 0 and 1"),
        (lambda: d.scaling(2, 1, 0.1, [1000], ONE_GB, memory_rate=0.0), "memory rate must be > 0"),
        (lambda: d.full_buckets(preset("default"), wire="fp8"), "wire 'fp8' is not one of fp32, fp16, bf16"),
        (lambda: d.lora_buckets(preset("default"), 0), "LoRA rank must be a positive integer"),
        (lambda: d.lora_buckets(preset("default"), 4, ("qq",)), "LoRA targets ['qq']"),
        (lambda: d.pack([1], 0), "bucket size must be > 0 bytes"),
        (lambda: d.split([1], -1), "bucket size must be > 0 bytes"),
        (lambda: link("wifi"), "unknown link 'wifi' (known: 10gbe, tb-tcp, tb5-rdma)"),
    ],
)
def test_bad_input_is_one_line_naming_it(call, words: str) -> None:
    with pytest.raises(AnekitError) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("[cost] ")


def test_every_link_figure_has_its_evidence() -> None:
    for name, ln in LINKS.items():
        assert ln.name == name and link(name) is ln and ln.engine in ("mpi", "mlx")
        for figure, unit in ((ln.rate, "GB/s"), (ln.latency, "us")):
            assert figure.unit == unit
            ev = figure.evidence
            assert ev.status in ("measured", "reported", "assumed")
            assert ev.status == "assumed" or ev.source.strip() != "none found"
            if ev.status == "assumed":
                assert "assumed" in ev.observed
        assert 0.1 < ln.rate.value < 20 and 1 <= ln.latency.value < 1000
    # the links are ordered as their rates: Ethernet, Thunderbolt over TCP, Thunderbolt RDMA
    rates = [LINKS[n].rate.value for n in ("10gbe", "tb-tcp", "tb5-rdma")]
    assert rates == sorted(rates)
    assert all(r.status in ("reported", "reference") for r in REPORTS)


def test_cli_prints_the_links_rows_for_each_number_of_macs(capsys: pytest.CaptureFixture[str]) -> None:
    from anekit.cli.main import main

    args = ["cost", "--config", "stories15M", "--chip", "m4", "--distributed", "2,4", "--link", "tb5-rdma"]
    assert main([*args, "--sequence-ms", "100", "--accum", "8"]) == 0
    out = capsys.readouterr().out
    assert "60.8 MB of fp32 gradients in 56 buckets" in out  # 4 x 15,191,712 bytes, 56 tensors
    assert "one sequence 100.0 ms (given)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("tb5-rdma ")]
    assert [r[1] for r in rows] == ["2", "4"]
    # the row's speed-up at k = 8 is the model's at the M4's host memory rate
    want = d.scaling(2, 8, 0.1, d.full_buckets(preset("stories15M")), link("tb5-rdma"), memory_rate=120e9)
    assert rows[0][-1] == f"{want.speedup:.2f}x"
    assert main([*args[:-2], "--lora", "8", "--sequence-ms", "100"]) == 0
    lora = capsys.readouterr().out  # rank 8 on q and v of stories15M: 6 layers x 2 x (8 x 288 + 288 x 8)
    assert f"{4 * 6 * 2 * 2 * 8 * 288 / 1e6:.1f} MB of fp32 gradients in 24 buckets" in lora
    assert lora.count("\n  ") == 3  # every link's source
    assert main([*args, "--sequence-ms", "100", "--accum", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    two = doc["rows"][0]
    assert (two["link"], two["macs"], two["accum"]) == ("tb5-rdma", 2, 8)
    assert two["speedup_at_accum"] == pytest.approx(want.speedup, rel=1e-12)
    assert two["exchange_ms"] == pytest.approx(two["chain_ms"] + two["broadcast_ms"], rel=1e-12)
    assert doc["links"]["tb5-rdma"]["rate"]["source"].startswith("hellas-ai/thunderbolt-ibverbs")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--distributed", "2"], "--distributed needs --config NAME and --chip CHIP"),
        (["--chip", "m4", "--link", "10gbe"], "are --distributed flags"),
        (["--chip", "m4", "--accum", "4"], "are --distributed flags"),
    ],
)
def test_cli_refuses_distributed_flags_out_of_place(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from anekit.cli.main import main

    assert main(["cost", "--config", "stories15M", *argv]) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
