#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, on a machine with an NVIDIA GPU and a CUDA build of torch:
#
#   bash scripts/gpu_benchmarks.sh OUT [MODEL]
#
# OUT gets the machine's facts, the CUDA tests' log and one JSON per measurement (scripts/benchmark.py);
# MODEL (a model file or checkpoint of the reference model) adds the decoding figures. The data folder of
# configs/multi30k_de_en_bahdanau.yaml must exist (nmt preprocess). STAGES picks the stages (default: all,
# in this order); BUDGET_S skips what would start after that many seconds, so a time-limited machine
# still returns the figures taken so far.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed
[[ $# -ge 1 && $# -le 2 && "$1" != -* && "${2:-}" != -* ]] || usage_error "takes OUT [MODEL], got '$*'"
cd "$(dirname "$0")/.."

out="$1"
model="${2:-}"
stages="${STAGES:-facts tests train decode large big-decode tf32}"
deadline=$((SECONDS + ${BUDGET_S:-1000000}))
mkdir -p "$out"

has() { [[ " $stages " == *" $1 "* ]] && (( SECONDS < deadline )); }
bench() { echo "== benchmark.py $*" >&2; python scripts/benchmark.py --device cuda --threads 4 "$@" || true; }

if has facts; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.csv"
  python scripts/machine_facts.py | tee "$out/machine.txt"
fi

if has tests; then
  python -m pytest -m cuda -q -p no:cacheprovider 2>&1 | tee "$out/pytest-cuda.log" || true
fi

# Training: target tokens/s over 100 updates after 10 of warm-up, the reference models in each precision.
if has train; then
  for name in bahdanau luong; do
    for precision in fp32 bf16 fp16; do
      has train && bench --config "configs/multi30k_de_en_$name.yaml" --precision "$precision" \
        --skip greedy beam --updates 100 --warmup 10 --json-out "$out/train-$name-$precision.json"
    done
  done
fi

# Decoding test_2016_flickr (1000 sentences), greedy and beam 5: whole process and decoding alone.
if has decode && [[ -n "$model" ]]; then
  for precision in fp32 bf16; do
    has decode && bench --checkpoint "$model" --precision "$precision" --skip train \
      --json-out "$out/decode-test2016-$precision.json"
  done
fi

# A large model (2-layer LSTMs: bi-encoder 2x512, decoder 1024, Luong general attention, 12k-token
# batches), with and without input feeding (without it the decoder RNN is one cuDNN call).
large=(--config configs/multi30k_de_en_luong.yaml --set model.rnn_type=lstm --set model.embedding_dim=512
       --set model.encoder_hidden=512 --set model.encoder_layers=2 --set model.decoder_hidden=1024
       --set model.decoder_layers=2 --set model.attention_dim=1024 --set training.batch_tokens=12000)
if has large; then
  for feed in false true; do
    for precision in fp32 bf16; do
      has large && bench "${large[@]}" --set "model.input_feeding=$feed" --precision "$precision" \
        --skip greedy beam --updates 30 --warmup 5 --json-out "$out/train-large-feed_$feed-$precision.json"
    done
  done
fi

# Decoding 100,000 sentences (the training source, repeated), fp32, at two batch budgets.
if has big-decode && [[ -n "$model" && -f data/multi30k/train.de.gz ]]; then
  big="$out/source-100k.de"
  python - "$big" <<'PY'
import gzip, itertools, sys
with gzip.open("data/multi30k/train.de.gz", "rt", encoding="utf-8") as handle:
    lines = handle.readlines()
with open(sys.argv[1], "w", encoding="utf-8") as out:
    out.writelines(itertools.islice(itertools.cycle(lines), 100_000))
PY
  for tokens in ${BIG_TOKENS:-8000 32000}; do
    has big-decode && bench --checkpoint "$model" --precision fp32 --skip train --source "$big" \
      --batch-tokens "$tokens" --json-out "$out/decode-100k-fp32-tokens$tokens.json"
  done
  rm -f "$big"
fi

# TF32 matrix products for float32 training (torch.set_float32_matmul_precision("high")).
if has tf32; then
  has tf32 && bench --config configs/multi30k_de_en_bahdanau.yaml --precision fp32 --matmul-precision high \
    --skip greedy beam --updates 100 --warmup 10 --json-out "$out/train-bahdanau-fp32-tf32.json"
  for feed in false true; do
    has tf32 && bench "${large[@]}" --set "model.input_feeding=$feed" --precision fp32 --matmul-precision high \
      --skip greedy beam --updates 30 --warmup 5 --json-out "$out/train-large-feed_$feed-fp32-tf32.json"
  done
fi
exit 0                                  # what the budget allowed is in OUT
