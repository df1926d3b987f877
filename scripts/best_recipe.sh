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
# Writes RUN/eval/: tune.json (the dev grid, best first) and TESTSET.hyp, TESTSET.json (sacreBLEU
# BLEU and chrF with signatures) for each test set. DEVICE=cuda decodes on a GPU (default auto).
# Multi30k comes from the public repository or MULTI30K_MIRROR=/path (used automatically when
# ../shared/data/multi30k exists) into DATA (default data/multi30k, where the configs read it).
# RUN=folder overrides the config's training.run_dir. BEAMS (default 1,5,10) and PENALTIES (default
# 0.6,1.0,1.4) are the beam sizes and length penalties tried on dev.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed
(( $# == 0 )) || usage_error "takes no arguments (got '$1'); its settings are environment variables"
cd "$(dirname "$0")/.."

CONFIG="${CONFIG:-configs/multi30k_de_en_bahdanau_best.yaml}"
THREADS="${THREADS:-0}"
DEVICE="${DEVICE:-auto}"
DATA="${DATA:-data/multi30k}"
BEAMS="${BEAMS:-1,5,10}"
PENALTIES="${PENALTIES:-0.6,1.0,1.4}"

# shellcheck source=scripts/setup_venv.sh
source scripts/setup_venv.sh
bash scripts/get_multi30k.sh "$DATA"
nmt preprocess --config "$CONFIG"          # also checks the config: one error line if it is wrong

# The run folder, and the dev and test files as the config names them (plain or .gz, as nmt reads
# them); held-out test sets are looked for beside the config's test set. One tab-separated line each.
listing="$(python - "$CONFIG" "${RUN:-}" <<'PY'
import sys
from pathlib import Path
from nmt.config import load_config
from nmt.data.corpus import DataError, resolve_text_file
config, run = load_config(sys.argv[1]), sys.argv[2]
data = config.data
print(f"run\t{Path(run).resolve() if run else config.training.run_dir}")
try:
    dev = [resolve_text_file(data.dev, lang, "data.dev") for lang in (data.src_lang, data.tgt_lang)]
except DataError:
    sys.exit(f"error: {sys.argv[1]}: the recipe chooses its decoding settings on data.dev, which it needs")
print(f"dev\t{dev[0]}\t{dev[1]}")
folder = Path(data.test or data.dev).parent
held_out = [str(folder / name) for name in ("test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")]
for prefix in ([data.test] if data.test else []) + held_out:
    try:
        src, ref = (resolve_text_file(prefix, lang, prefix) for lang in (data.src_lang, data.tgt_lang))
    except DataError:                              # a test set that is not there
        continue
    print(f"{Path(prefix).name}\t{src}\t{ref}")
PY
)"
tests=()
while IFS=$'\t' read -r name first second; do
  case "$name" in
    run) RUN="$first" ;;
    dev) dev_src="$first" dev_ref="$second" ;;
    *) tests+=("$name"$'\t'"$first"$'\t'"$second") ;;
  esac
done <<< "$listing"

train=(nmt train --config "$CONFIG" --set training.run_dir="$RUN" --set training.threads="$THREADS")
if [[ -f "$RUN/last.pt" ]]; then
  "${train[@]}" --resume                   # an interrupted run continues; a finished one says so
elif [[ -f "$RUN/.nmt-folder.json" ]]; then
  "${train[@]}" --overwrite                # killed before its first checkpoint: only nmt's files go
else
  "${train[@]}"
fi

shopt -s nullglob
best_k=("$RUN"/best-step*.pt)
models=("$RUN/best.pt")
if (( ${#best_k[@]} > 1 )); then
  averaged="$RUN/averaged-best${#best_k[@]}.pt"
  for checkpoint in "${best_k[@]}"; do           # average again if a checkpoint is newer (a resumed run)
    [[ -f "$averaged" && "$checkpoint" -nt "$averaged" ]] && rm -f "$averaged"
  done
  [[ -f "$averaged" ]] || nmt average "${best_k[@]}" --output "$averaged"
  models+=("$averaged")
fi

mkdir -p "$RUN/eval"
python scripts/tune_decoding.py --models "${models[@]}" --src "$dev_src" --ref "$dev_ref" --device "$DEVICE" \
  --beam-sizes "$BEAMS" --length-penalties "$PENALTIES" --threads "$THREADS" --json "$RUN/eval/tune.json"
IFS=$'\t' read -r beam penalty model < <(python -c "import json, sys; r = json.load(open(sys.argv[1]))['rows'][0]; \
print(r['beam_size'], r['length_penalty'], r['model'], sep='\t')" "$RUN/eval/tune.json")

for entry in "${tests[@]}"; do
  IFS=$'\t' read -r testset src ref <<< "$entry"
  nmt translate --checkpoint "$model" --beam-size "$beam" --length-penalty "$penalty" --threads "$THREADS" \
    --device "$DEVICE" --input "$src" --output "$RUN/eval/$testset.hyp"
  echo "== $testset ($model, beam $beam, length penalty $penalty)"
  nmt evaluate --hyp "$RUN/eval/$testset.hyp" --ref "$ref" --json "$RUN/eval/$testset.json"
done
