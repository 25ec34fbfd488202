"""Benchmark: Hugging Face-shaped models: import, greedy sampling tokens/s, a LoRA step's time and peak RSS.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_hf.py [--shapes smollm2-135m qwen3-0.6b] [--seq 128]

Each shape is a random checkpoint with the real model's config (layers, heads, head size, vocabulary),
written in bf16 to a temporary directory, then measured in a fresh process (so its peak RSS is its own):

- sampling (one process): ``anekit.hf.model.load_model`` (bf16 widened to float32), then greedy
  ``Sampler.generate_ids`` on the CPU, an 8-token prompt then ``--tokens`` tokens;
- LoRA (another process): the import a LoRA run does (frozen matrices as float16), then one optimizer
  step of one sequence of ``--seq`` tokens (rank 8 on q and v, dynamic-weight kernels in the simulator)
  after a warm-up step, as ``anekit train --init DIR --lora 8`` runs it;
- each process's peak RSS (VmHWM), and the LoRA one's per parameter of the model.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {
    # HuggingFaceTB/SmolLM2-135M's config.json
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "num_hidden_layers": 30, "vocab_size": 49152, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    },
    # Qwen/Qwen3-0.6B's config.json
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 28, "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    },
}  # fmt: skip


def write_random(directory: Path, raw: dict) -> None:
    """A random bf16 checkpoint of ``raw`` (config.json's contents) in Hugging Face's layout."""
    from anekit.hf.config import parse_config
    from anekit.hf.model import _tensors_to_write
    from anekit.hf.safetensors_io import write_checkpoint
    from anekit.llama.params import Params

    cfg = parse_config(raw).cfg
    params = Params.init(cfg, seed=0, tied=raw["tie_word_embeddings"])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    write_checkpoint(directory, _tensors_to_write(params, {}, "BF16"), max_shard_bytes=2 << 30)


def rss_mb() -> float:
    """This process's peak RSS in MB: VmHWM (Linux: its own address space's, where ru_maxrss keeps the
    forking parent's peak across exec), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    scale = 1 if sys.platform != "darwin" else 1024  # KiB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / scale


def measure_sampling(directory: Path, tokens: int) -> dict:
    """Import (float32) and greedy sampling, in this process."""
    from anekit.hf.model import load_model
    from anekit.llama.sample import Sampler

    out: dict = {}
    t0 = time.perf_counter()
    model = load_model(directory)
    out["import_s"] = time.perf_counter() - t0
    out["params"] = model.params.count()
    out["rss_import_mb"] = rss_mb()

    class Ids:
        bos_id, eos_ids, vocab_size = -1, (), model.cfg.vocab_size

    sampler = Sampler(model.params, Ids())
    prompt = list(range(5, 13))
    list(sampler.generate_ids(prompt, len(prompt) + 2, temperature=0.0))  # warm-up
    t0 = time.perf_counter()
    n = len(list(sampler.generate_ids(prompt, len(prompt) + tokens, temperature=0.0))) - len(prompt) + 1
    out["sample_tokens_per_s"] = n / (time.perf_counter() - t0)
    out["rss_sample_mb"] = rss_mb()
    return out


def measure_lora(directory: Path, seq: int) -> dict:
    """A LoRA run's import (frozen float16 matrices) and one step, in this process."""
    from anekit import runtime
    from anekit.hf.adapters import Adapters, LoraSpec
    from anekit.hf.model import load_model
    from anekit.llama.kernel_sets import make_kernels
    from anekit.llama.step import Timer, train_step
    from anekit.training.lora import LoraTrainable, frozen_base
    from anekit.training.state import TrainConfig, TrainState

    out: dict = {}
    base = frozen_base(load_model(directory, seq_len=seq, matrix_dtype=np.float16).params)
    out["params"] = base.count()
    adapters = Adapters.init(LoraSpec(8, 16.0, ("q", "v")), base.cfg, np.random.default_rng(0))
    trainable = LoraTrainable(base, adapters)
    kernels = make_kernels(runtime.open("sim", compile_budget=10**9), base.cfg, "dynamic")
    kernels.compile(trainable.params, Timer())
    rng = np.random.default_rng(1)
    state, tc = TrainState(base, None, None), TrainConfig(lr=1e-4, weight_decay=0.0)
    times = []
    for _ in range(2):  # a warm-up step, then the measured one
        window = rng.integers(0, base.cfg.vocab_size, seq + 1)
        t0 = time.perf_counter()
        trainable.zero()
        sink = trainable.sink(kernels)
        train_step(kernels, trainable.params, sink, window[:-1], window[1:], Timer(), 1024.0)
        trainable.unscale(1 / 1024)
        trainable.apply(state, tc)
        times.append(time.perf_counter() - t0)
    out["lora_step_s"] = times[-1]
    out["lora_trained_params"] = sum(a.size for a in [*adapters.a.values(), *adapters.b.values()])
    out["rss_lora_mb"] = rss_mb()
    out["rss_bytes_per_param"] = out["rss_lora_mb"] * 2**20 / out["params"]
    return out


def _child(what: str, directory: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--measure", what, str(directory), "--seq", str(args.seq), "--tokens",
           str(args.tokens)]  # fmt: skip
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)  # the child: what, checkpoint directory
    args = ap.parse_args()
    if args.measure:
        what, directory = args.measure[0], Path(args.measure[1])
        result = (
            measure_sampling(directory, args.tokens)
            if what == "sample"
            else measure_lora(directory, args.seq)
        )
        print(json.dumps(result))
        return
    for name in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / name
            write_random(directory, SHAPES[name])
            sampled, lora = _child("sample", directory, args), _child("lora", directory, args)
        print(
            f"{name}: {sampled['params'] / 1e6:.1f} M parameters; import {sampled['import_s']:.1f} s, "
            f"greedy sampling {sampled['sample_tokens_per_s']:.1f} tokens/s (peak RSS "
            f"{sampled['rss_sample_mb']:.0f} MB); LoRA step (rank 8 on q, v: "
            f"{lora['lora_trained_params'] / 1e6:.2f} M trained; 1 x "
            f"{args.seq} tokens) {lora['lora_step_s']:.2f} s, peak RSS {lora['rss_lora_mb']:.0f} MB = "
            f"{lora['rss_bytes_per_param']:.1f} bytes per parameter"
        )


if __name__ == "__main__":
    main()
