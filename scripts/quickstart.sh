#!/usr/bin/env bash
# The main job, from nothing: install, get Multi30k, preprocess, train the reference model
# (Bahdanau, de->en), translate test_2016_flickr with beam 5, score it with sacreBLEU.
#
#   bash scripts/quickstart.sh                 # 30 minutes of training
#   MINUTES=5 bash scripts/quickstart.sh       # a shorter run
#   CONFIG=configs/multi30k_de_en_luong.yaml bash scripts/quickstart.sh
#
# THREADS=N sets the CPU threads of training and translation (default 0: torch's default, one per
# core); RUN=folder is where the run goes (default runs/quickstart_CONFIGNAME). Multi30k comes from
# the public repository, or from a local copy: MULTI30K_MIRROR=/path (used automatically when
# ../shared/data/multi30k exists).
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed
(( $# == 0 )) || usage_error "takes no arguments (got '$1'); its settings are environment variables"
cd "$(dirname "$0")/.."

CONFIG="${CONFIG:-configs/multi30k_de_en_bahdanau.yaml}"
MINUTES="${MINUTES:-30}"
THREADS="${THREADS:-0}"
RUN="${RUN:-runs/quickstart_$(basename "$CONFIG" .yaml)}"

# shellcheck source=scripts/setup_venv.sh
source scripts/setup_venv.sh
bash scripts/get_multi30k.sh data/multi30k

nmt preprocess --config "$CONFIG"
nmt train --config "$CONFIG" --overwrite \
  --set training.max_minutes="$MINUTES" --set training.threads="$THREADS" --set training.run_dir="$PWD/$RUN"

mkdir -p "$RUN/eval"
zcat data/multi30k/test_2016_flickr.de.gz > "$RUN/eval/test_2016_flickr.de"
zcat data/multi30k/test_2016_flickr.en.gz > "$RUN/eval/test_2016_flickr.en"
nmt translate --checkpoint "$RUN/best.pt" --beam-size 5 --threads "$THREADS" \
  --input "$RUN/eval/test_2016_flickr.de" --output "$RUN/eval/hyp.en"
nmt evaluate --hyp "$RUN/eval/hyp.en" --ref "$RUN/eval/test_2016_flickr.en" --json "$RUN/eval/scores.json"
