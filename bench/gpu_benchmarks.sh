#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, on a machine with an NVIDIA GPU and a CUDA build of torch:
#
#   bash scripts/gpu_benchmarks.sh OUT [MODEL]
#
# OUT (e.g. docs/results/h200-DATE) gets one JSON per measurement, each with the machine's facts (GPU,
# driver, CUDA, cuDNN, torch), the CUDA tests' log and the recipe run's logs; `python -m bench.gpu_table
# OUT` prints the tables of docs/benchmarks.md from them. MODEL (a model file or checkpoint of the
# reference model) is what the decoding stages translate with; without one, the `model` stage trains
# it on the GPU for MODEL_MINUTES (default 2.5) with the GPU recipe's settings, into MODEL_RUN (default
# a temporary folder; a MODEL_RUN that holds a best.pt already is used as it is, so later calls on the
# same machine need not train again). The data folder of
# configs/multi30k_de_en_bahdanau.yaml must exist (nmt preprocess). On a machine without a network,
# bench/gpu_kit.sh brings what this needs beyond the checkout. ONMT=folder of an OpenNMT-py 3.5.1 install (its bin/onmt_* commands, as
# ../shared/peers/opennmt-setup.sh makes) adds the side-by-side stage. STAGES picks the stages (default:
# all, in this order); BUDGET_S skips what would start after that many seconds, so a time-limited machine
# still returns the figures taken so far. DATA_CONFIG (default configs/multi30k_de_en_bahdanau.yaml) names
# the data: its test set is decoded, its training source repeated to SENTENCES (default 100000) lines, and
# the profile trains it; RUNS (default 3): the runs behind each test_2016_flickr figure (their median). DEVICE=cpu
# rehearses every stage on the CPU, where no CUDA graph applies (the suite does, with a small model), so
# that a GPU's time is not spent on a broken stage.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../scripts/script_usage.sh"   # links followed
[[ $# -ge 1 && $# -le 2 && "$1" != -* && "${2:-}" != -* ]] || usage_error "takes OUT [MODEL], got '$*'"
device="${DEVICE:-cuda}"
[[ "$device" == cuda || "$device" == cpu ]] || usage_error "takes DEVICE=cuda or DEVICE=cpu, got DEVICE=$device"
out="$(realpath -m "$1")"                              # OUT and MODEL as given from the caller's folder
model="${2:+$(realpath -m "$2")}"
config="$(realpath -m "${DATA_CONFIG:-$(dirname "$0")/../configs/multi30k_de_en_bahdanau.yaml}")"
onmt="${ONMT:+$(realpath -m "$ONMT")}"
model_run="${MODEL_RUN:+$(realpath -m "$MODEL_RUN")}"
cd "$(dirname "$0")/.."

sentences="${SENTENCES:-100000}"
runs="${RUNS:-3}"
stages="${STAGES:-facts tests train model decode whole profile recipe curve compare}"
deadline=$((SECONDS + ${BUDGET_S:-1000000}))
mkdir -p "$out"
test_src="$(mktemp)" test_ref="$(mktemp)" big="$(mktemp)"
trap 'rm -f "$test_src" "$test_ref" "$big"' EXIT
has_stage() { [[ " $stages " == *" $1 "* ]]; }
# the test set's source and reference; for the 100,000-sentence stages, the training source repeated to
# $sentences lines (read no further than that)
big_count=0
if has_stage decode || has_stage whole; then big_count="$sentences"; fi
python - "$config" "$big_count" "$test_src" "$test_ref" "$big" <<'PY'
import itertools, sys
from nmt.config import load_config
from nmt.data.corpus import open_lines, read_lines, resolve_text_file
config, count, test_src, test_ref, big = sys.argv[1:]
data = load_config(config).data
for path, lang in ((test_src, data.src_lang), (test_ref, data.tgt_lang)):
    lines = read_lines(resolve_text_file(data.test, lang, "data.test"))
    open(path, "w", encoding="utf-8").write("".join(line + "\n" for line in lines))
if int(count):
    with open_lines(resolve_text_file(data.train, data.src_lang, "data.train")) as train, \
            open(big, "w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in itertools.islice(itertools.cycle(train), int(count)))
PY

has() { has_stage "$1" && (( SECONDS < deadline )); }

if has facts; then
  if [[ "$device" == cuda ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.csv"
  fi
  python -c "import json; from bench.harness import stamp; print(json.dumps(stamp(), indent=2))" \
    | tee "$out/machine.json"
fi

if has tests; then
  # only the modules that hold CUDA tests: collecting the others imports what a GPU image may lack
  # (the server's uvicorn), and one collection error stops pytest before any test runs
  mapfile -t cuda_modules < <(grep -l "pytest.mark.cuda" tests/test_*.py)
  python -m pytest -m cuda -q -p no:cacheprovider "${cuda_modules[@]}" 2>&1 | tee "$out/pytest-cuda.log" || true
fi

# Training: target tokens/s over 200 updates after a 260-update warm-up (an epoch: every batch shape
# captured), the reference models, fp32 and bf16, each with the CUDA graphs on and off.
if has train; then
  for name in bahdanau luong; do
    for precision in fp32 bf16; do
      for graphs in true false; do
        has train && python -m bench.benchmark --config "configs/multi30k_de_en_$name.yaml" --device "$device" \
          --threads 4 --precision "$precision" --set "training.cuda_graphs=$graphs" --skip greedy beam \
          --updates 200 --warmup 260 --json-out "$out/train-$name-$precision-graphs_$graphs.json" || true
      done
    done
  done
fi

# No MODEL: one trained here, the reference model with the GPU recipe's settings, for a fixed time.
if [[ -z "$model" ]] && has model; then
  model_run="${model_run:-$(mktemp -d)/run}"
  if [[ ! -f "$model_run/best.pt" ]]; then
    nmt train --config configs/multi30k_de_en_bahdanau_gpu.yaml --set training.max_minutes="${MODEL_MINUTES:-2.5}" \
      --set training.run_dir="$model_run" --set training.device="$device" 2>&1 \
      | tr '\r' '\n' | grep -v 'upd/s' > "$out/model.log" || true
  fi
  if [[ -f "$model_run/best.pt" ]]; then model="$model_run/best.pt"; else echo "no model: see $out/model.log"; fi
fi

# Decoding test_2016_flickr and 100,000 sentences (the training source, repeated): decoding alone, graphs
# on and off, fp32 and bf16, greedy and beam 5; start-up to the first translation.
if has decode && [[ -n "$model" ]]; then
  python -m bench.gpu_decoding "$model" --source "$test_src" --reference "$test_ref" --runs "$runs" \
    --device "$device" --precisions fp32 bf16 --first-line --json-out "$out/decode-test2016.json" || true
  # the same at the CPU's batch size, beside the GPU's default (docs/benchmarks.md, "Decoding batches on a GPU";
  # a MODEL saved before that default keeps its 8000: each entry records the batch_tokens it ran with)
  has decode && python -m bench.gpu_decoding "$model" --source "$test_src" --reference "$test_ref" --runs "$runs" \
    --device "$device" --precisions bf16 --batch-tokens 8000 --json-out "$out/decode-test2016-8000.json" || true
  has decode && python -m bench.gpu_decoding "$model" --source "$big" --runs 1 --precisions fp32 bf16 \
    --device "$device" --batch-tokens 64000 --json-out "$out/decode-100k.json" || true
fi

# 100,000 sentences as a user runs them: `nmt translate` as a whole process (start-up, model loading and
# reading/writing text included), greedy and beam 5, at the default precision and CUDA graphs.
if has whole && [[ -n "$model" ]]; then
  python - "$model" "$big" "$device" "$out/whole-100k.json" <<'PY'
import json, subprocess, sys, time
from pathlib import Path
from bench.harness import write_result
model, source, device, out = sys.argv[1:]
sentences = sum(1 for _ in open(source, "rb"))
startup = {}                         # what every process pays before nmt does anything
for what, code in (("import_torch_s", "import torch"),
                   ("cuda_init_s", "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()")):
    if what == "cuda_init_s" and device != "cuda":
        continue
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    startup[what] = sorted(times)[1]
print(json.dumps(startup), flush=True)
rows = []
for beam in (1, 5):
    for run in range(2):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", model, "-i", source, "-q",
                               "--device", device, "--beam-size", str(beam), "--batch-tokens", "64000"],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        produced = proc.stdout.count("\n")
        rows.append({"beam": beam, "run": run, "seconds": seconds, "lines_out": produced,
                     "sent_per_s": produced / seconds, "rc": proc.returncode, "stderr": proc.stderr[-500:]})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "stderr"}), flush=True)
write_result(Path(out), {"sentences": sentences, "batch_tokens": 64000, "precision": "auto", "runs": rows,
                         "startup_median_s": startup})
PY
fi

# Kernels per training update and per decoded batch, and how busy they keep the GPU; beside them the
# operations per step the code dispatches (bench/step_kernels.py, counted on the CPU).
if has profile; then
  size=(--updates 20 --lines 200)
  [[ "$device" == cpu ]] && size=(--updates 2 --lines 20)   # a rehearsal: the CPU's op events take long to parse
  python -m bench.profile_gpu_step --config "$config" --device "$device" "${size[@]}" \
    ${model:+--model "$model" --source "$test_src"} --json-out "$out/profile.json" || true
  kernels=()
  [[ "$device" == cpu ]] && kernels=(--config "$config")   # a rehearsal counts the data config's (small) model
  python -m bench.step_kernels "${kernels[@]}" --json-out "$out/step-kernels.json" || true
fi

# The GPU recipe from nothing to its test BLEU: trains until its schedule ends it, averages, chooses on dev.
if has recipe; then
  run="$(mktemp -d)/run"
  CONFIG=configs/multi30k_de_en_bahdanau_gpu.yaml DEVICE="$device" RUN="$run" BEAMS=1,5,10 NMT_SKIP_VENV=1 \
    bash scripts/best_recipe.sh 2>&1 | tr '\r' '\n' | grep -v 'upd/s' > "$out/recipe.log" || true
  python -m bench.recipe_summary "$run" configs/multi30k_de_en_bahdanau_gpu.yaml --json-out "$out/recipe.json" \
    || true
  cp "$run/metrics.jsonl" "$out/recipe-metrics.jsonl" 2>/dev/null || true
fi

# OpenNMT-py's dev BLEU by minute on the same GPU, to plot beside the recipe's curve.
if has curve && [[ -n "$onmt" ]]; then
  python -m bench.onmt_curve --onmt-venv "$onmt" --device "$device" --steps 6000 --save-every 500 \
    --json-out "$out/onmt-curve.json" 2>&1 | tee "$out/onmt-curve.log" || true
fi

# Side by side with OpenNMT-py on the same GPU, alternating runs, median of 3.
if has compare && [[ -n "$onmt" ]]; then
  python -m bench.compare_opennmt --onmt-venv "$onmt" --device "$device" --threads 4 --runs 3 --steps 460 \
    --warmup 260 --json-out "$out/compare-train.json" || true
  if [[ -n "$model" ]] && has compare; then
    python -m bench.compare_opennmt --onmt-venv "$onmt" --device "$device" --task train-model --steps 800 || true
    python -m bench.compare_opennmt --onmt-venv "$onmt" --device "$device" --task decode --runs 3 --threads 4 \
      --checkpoint "$model" --onmt-checkpoint bench/out/opennmt/run/model_step_800.pt \
      --json-out "$out/compare-decode.json" || true
  fi
fi
exit 0                                  # what the budget allowed is in OUT
