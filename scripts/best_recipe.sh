#!/usr/bin/env bash
# The best-quality recipe, from nothing: install, get Multi30k (with the later test sets), preprocess,
# train configs/multi30k_de_en_bahdanau_best.yaml until its plateau schedule ends it, average the
# best 5 checkpoints, choose checkpoint / beam size / length penalty on dev (val) alone, then score
# that one choice on test_2016_flickr and on every later test set present.
#
#   bash scripts/best_recipe.sh                      # hours on a CPU; re-running continues the run
#   CONFIG=configs/multi30k_de_en_luong_best.yaml bash scripts/best_recipe.sh
#   THREADS=2 bash scripts/best_recipe.sh
#
# Writes RUN/eval/: tune.json (the dev grid, best first) and TESTSET.hyp.en, TESTSET.json (sacreBLEU
# BLEU and chrF with signatures) for each test set. Multi30k comes from the public repository or
# MULTI30K_MIRROR=/path (used automatically when ../shared/data/multi30k exists) into DATA (default
# data/multi30k, where the configs read it). RUN=folder overrides the config's training.run_dir.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG="${CONFIG:-configs/multi30k_de_en_bahdanau_best.yaml}"
THREADS="${THREADS:-0}"
DATA="${DATA:-data/multi30k}"
BEAMS="${BEAMS:-1,5,10}"
PENALTIES="${PENALTIES:-0.6,1.0,1.4}"

# shellcheck source=scripts/setup_venv.sh
source scripts/setup_venv.sh
bash scripts/get_multi30k.sh "$DATA"
run_dir=()
if [[ -n "${RUN:-}" ]]; then
  run_dir=(--set training.run_dir="$(realpath -m "$RUN")")
else
  RUN="$(python -c "import sys; from nmt.config import load_config; print(load_config(sys.argv[1]).training.run_dir)" \
    "$CONFIG")"
fi

nmt preprocess --config "$CONFIG"
resume=()
[[ -f "$RUN/last.pt" ]] && resume=(--resume)     # an interrupted (or finished) run continues
nmt train --config "$CONFIG" "${resume[@]}" "${run_dir[@]}" --set training.threads="$THREADS"

shopt -s nullglob
best_k=("$RUN"/best-step*.pt)
models=("$RUN/best.pt")
if (( ${#best_k[@]} > 1 )); then
  nmt average "${best_k[@]}" --output "$RUN/averaged-best${#best_k[@]}.pt"
  models+=("$RUN/averaged-best${#best_k[@]}.pt")
fi

mkdir -p "$RUN/eval"
text() { if [[ -f "$DATA/$1.gz" ]]; then echo "$DATA/$1.gz"; else echo "$DATA/$1"; fi; }
python scripts/tune_decoding.py --models "${models[@]}" --src "$(text val.de)" --ref "$(text val.en)" \
  --beam-sizes "$BEAMS" --length-penalties "$PENALTIES" --threads "$THREADS" --json "$RUN/eval/tune.json"
read -r model beam penalty < <(python -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; \
print(r['model'], r['beam_size'], r['length_penalty'])" "$RUN/eval/tune.json")

for testset in test_2016_flickr test_2017_flickr test_2017_mscoco test_2018_flickr; do
  src="$(text "$testset.de")" ref="$(text "$testset.en")"
  [[ -f "$src" && -f "$ref" ]] || continue
  nmt translate --checkpoint "$model" --beam-size "$beam" --length-penalty "$penalty" --threads "$THREADS" \
    --input "$src" --output "$RUN/eval/$testset.hyp.en"
  echo "== $testset ($model, beam $beam, length penalty $penalty)"
  nmt evaluate --hyp "$RUN/eval/$testset.hyp.en" --ref "$ref" --json "$RUN/eval/$testset.json"
done
