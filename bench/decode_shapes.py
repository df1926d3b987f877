"""How `nmt translate` cuts a file into batches, and how many shapes its CUDA graphs need, by batch size.

A GPU captures one graph per new padded batch shape (nmt.decode.graphs), and a captured step costs about
the same whatever its rows: fewer, larger batches mean fewer steps and fewer captures. This counts both
without a GPU (the cut and the buckets are the Translator's), for a source file and a model's vocabulary:

    python -m bench.decode_shapes --spm data/m30k_de_en_spm8k/spm.model --source test.de --beams 1 5 \
        --batch-tokens 8000 32000 64000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from nmt.data.corpus import read_lines
from nmt.data.rows import cut_by_budget
from nmt.data.tokenizer import Vocab
from nmt.decode.graphs import static_shape


def shapes(lengths: np.ndarray, beam: int, batch_tokens: int) -> dict:
    """The Translator's batches of one chunk of lines (longest first, `batch_tokens` // beam source tokens
    each, EOS included) and the graphs' padded (sentences, source length) shape of each."""
    order = np.argsort(-lengths, kind="stable")
    batches = cut_by_budget(order, lengths, max(1, batch_tokens // beam), 0)
    padded = [static_shape(len(rows), int(lengths[rows].max())) for rows in batches]
    return {"beam": beam, "batch_tokens": batch_tokens, "batches": len(batches), "shapes": len(set(padded)),
            "longest_source_per_batch_summed": int(sum(int(lengths[rows].max()) for rows in batches)),
            "padded": [list(shape) for shape in padded]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spm", type=Path, required=True, help="the source side's SentencePiece model")
    parser.add_argument("--source", type=Path, required=True, help="a text file, one sentence per line")
    parser.add_argument("--lines", type=int, default=10000, help="lines of the file: `nmt translate`'s chunk")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[8000, 32000, 64000])
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    lines = read_lines(args.source)[: args.lines]
    lengths = np.array([len(ids) + 1 for ids in Vocab(args.spm).encode(lines)])
    rows = [shapes(lengths, beam, tokens) for beam in args.beams for tokens in args.batch_tokens]
    for row in rows:
        print(f"beam {row['beam']}, batch_tokens {row['batch_tokens']}: {row['batches']} batches, "
              f"{row['shapes']} shapes, {row['longest_source_per_batch_summed']} source positions of the "
              f"longest line per batch summed (the steps grow with it)")
    if args.json_out:
        args.json_out.write_text(json.dumps({"source": args.source.name, "lines": len(lines), "rows": rows},
                                            indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
