#!/usr/bin/env python
"""Kernels per decoder step, counted on any machine: the ATen operations that do work, as dispatched.

    python -m bench.step_kernels [--config configs/multi30k_de_en_bahdanau.yaml ...] --json-out F

At the reference batch a decoder step on a GPU costs about one launch, or one slot in a CUDA graph,
per operation: its time follows the number of operations more than their size. That number does not
need a GPU to be known: every operation passes PyTorch's dispatcher, on the CPU as on CUDA, and a
TorchDispatchMode sees it. Views (reshapes, slices, transposes) launch nothing and are not counted.
A matrix product that adds a matrix (addmm with a 2-D addend, baddbmm) counts two: on CUDA, cuBLAS
gets the addend copied into its output first (a 1-D bias rides in the product's epilogue: one).
Some other operations take two kernels on CUDA (topk), and cuBLAS may add one; the counts here are
the GPU's launches to within those, for the searches' steps exactly as `nmt.decode.graphs` captures
them.

Counted per step, in float32 and under bf16 autocast, with the model's random initial weights (the
counts do not depend on them); what CUDA graphs capture runs without autocast's cast cache, as there:
  * greedy and beam 5 as captured (`SearchGraphs` run eagerly: the same operations);
  * one training step of the decoder, forward and backward (the difference between two target
    lengths, so the encoder and the loss drop out), on the CPU's path and on CUDA's: the CPU takes some
    gradients once after the loop (nmt.model.shared_grads), CUDA at every step.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.harness import OUT, write_result


class KernelCount(TorchDispatchMode):
    """Counts the operations dispatched inside it that are not views, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name != "_unsafe_view":
            self.ops[name] += 2 if name == "baddbmm" or (name == "addmm" and args[0].dim() == 2) else 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _batch(model, sentences: int, src_len: int, tgt_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ids of the model's vocabularies (no PAD, BOS, EOS), every sentence `src_len` long."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, model.encoder.embed.num_embeddings, (sentences, src_len), generator=generator)
    tgt = torch.randint(4, model.decoder.output.out_features, (sentences, tgt_len), generator=generator)
    return src, torch.full((sentences,), src_len), tgt


def search_step(model, beam: int, sentences: int = 64, src_len: int = 20) -> dict:
    """Operations per step of the captured greedy (beam 1) or beam search chunk."""
    from nmt.decode import graphs as graphed
    from nmt.decode.search import SearchSettings
    from nmt.decode.steps import Decoding

    graphs = graphed.SearchGraphs(Decoding(model), capture=False)
    src, lengths, _ = _batch(model, sentences, src_len, 1)
    counter = KernelCount()
    original = graphs._graph

    def counted(key, build, chunk):                  # every replay of a chunk runs under the counter
        replay, static = original(key, build, chunk)

        def run() -> None:
            with counter:
                replay()
        return run, static

    def search() -> None:                          # one chunk of steps
        if beam == 1:
            graphs.greedy(src, lengths, SearchSettings(max_len=graphed.STEPS_PER_GRAPH))
        else:
            graphs.beam(src, lengths, SearchSettings(beam_size=beam, max_len=graphed.STEPS_PER_GRAPH))

    with torch.no_grad():
        search()                                     # warm-up, as before a capture: builds the derived weights
        graphs._graph = counted
        search()
    steps = graphed.STEPS_PER_GRAPH
    return {"beam": beam, "kernels_per_step": counter.total / steps,
            "by_op": {name: n / steps for name, n in counter.ops.most_common()}}


def training_step(model, sentences: int = 32, src_len: int = 20, tgt_lens: tuple[int, int] = (16, 24),
                  cuda_path: bool = False) -> dict:
    """Forward and backward operations per target position of teacher-forced training; `cuda_path`: as
    CUDA runs it, without the CPU's gradients taken once after the loop (nmt.model.bahdanau.shares_grads)."""
    from nmt.model import bahdanau

    totals = []
    for tgt_len in tgt_lens:
        src, lengths, tgt = _batch(model, sentences, src_len, tgt_len)
        counter = KernelCount()
        with mock.patch.object(bahdanau, "shares_grads", lambda device: not cuda_path), counter:
            logits, _ = model(src, lengths, tgt)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
        model.zero_grad(set_to_none=True)
        totals.append(counter)
    steps = tgt_lens[1] - tgt_lens[0]
    by_op = {name: (totals[1].ops[name] - totals[0].ops[name]) / steps for name in totals[1].ops}
    return {"kernels_per_step": (totals[1].total - totals[0].total) / steps,
            "by_op": {k: v for k, v in sorted(by_op.items(), key=lambda kv: -kv[1]) if v}}


def count(config_path: str, precision: str) -> dict:
    """The three counts for a config's model, in float32 or under bf16 autocast (whose casts are
    operations too: the GPU's default precision with CUDA graphs is bf16)."""
    from nmt.config import load_config
    from nmt.model.seq2seq import Seq2Seq

    config = load_config(config_path, [])
    torch.manual_seed(0)
    vocab = config.data.vocab_size                       # its SentencePiece size; the counts do not depend on it
    model = Seq2Seq.from_config(config.model, vocab, vocab).eval()
    result = {"config": config_path, "precision": precision,
              "model": {k: getattr(config.model, k) for k in ("rnn_type", "attention", "decoder_layers",
                                                              "input_feeding")}}
    bf16 = precision == "bf16"
    captured = {"device_type": "cpu", "dtype": torch.bfloat16, "enabled": bf16, "cache_enabled": False}
    with torch.autocast(**captured):         # as a CUDA graph captures them: no cast cache, a cast every step
        result |= {"greedy": search_step(model, 1), "beam": search_step(model, 5)}
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        result["training"] = training_step(model)
    with torch.autocast(**captured):
        result["training_cuda_path"] = training_step(model, cuda_path=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["configs/multi30k_de_en_bahdanau.yaml",
                                                        "configs/multi30k_de_en_luong.yaml"])
    parser.add_argument("--json-out", type=Path, default=OUT / "step_kernels.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [count(path, precision) for path in args.config for precision in ("fp32", "bf16")]
    for row in rows:
        print(f"{row['config']} ({row['precision']}): greedy {row['greedy']['kernels_per_step']:.1f}, "
              f"beam 5 {row['beam']['kernels_per_step']:.1f}, "
              f"training {row['training']['kernels_per_step']:.1f} (CUDA's path "
              f"{row['training_cuda_path']['kernels_per_step']:.1f}) kernels per step")
    write_result(args.json_out, {"counted": "ATen operations that are not views, per decoder step", "models": rows},
                 threads=1)


if __name__ == "__main__":
    main()
