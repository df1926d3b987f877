#!/usr/bin/env bash
# Fetch the Multi30k task-1 raw files (train, val, test_2016_flickr; de, en, fr) into a folder, and
# the later test sets (test_2017_flickr, test_2017_mscoco, test_2018_flickr) for held-out scoring.
#
#   scripts/get_multi30k.sh [DEST]                       download from the public repository
#   MULTI30K_MIRROR=/path scripts/get_multi30k.sh [DEST]   copy from a local mirror instead
#   scripts/get_multi30k.sh --mirror /path [DEST]
#
# DEST defaults to data/multi30k. Files stay gzipped (nmt reads .gz directly). A mirror must hold
# the first three splits; the later test sets are copied when it has them and skipped (with a note)
# when it does not. Offline, the first failed download ends the downloads: one line says why.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed

mirror="${MULTI30K_MIRROR:-}"
if [[ "${1:-}" == "--mirror" ]]; then
  [[ -n "${2:-}" ]] || usage_error "--mirror needs a folder"
  mirror="$2"
  shift 2
fi
[[ $# -le 1 && "${1:-}" != -* ]] || usage_error "takes [--mirror FOLDER] [DEST], got '$*'"
dest="${1:-data/multi30k}"
base_url="https://github.com/multi30k/dataset/raw/master/data/task1/raw"
files=() heldout=() skipped=()
for split in train val test_2016_flickr; do
  for lang in de en fr; do files+=("$split.$lang.gz"); done
done
for split in test_2017_flickr test_2017_mscoco test_2018_flickr; do
  for lang in de en fr; do heldout+=("$split.$lang.gz"); done
done

# Copy or download one file into $dest (kept if already there); returns 1 when the mirror lacks it
# or the download fails, with curl's last message in $why.
why=""
fetch() {
  local f="$1"
  [[ -s "$dest/$f" ]] && return 0
  if [[ -n "$mirror" ]]; then
    [[ -f "$mirror/$f" ]] || return 1
    cp "$mirror/$f" "$dest/$f.part" || exit 1
  else
    if ! why=$(curl -fsSL --retry 3 -o "$dest/$f.part" "$base_url/$f" 2>&1); then
      why=$(tail -n 1 <<< "$why")
      rm -f "$dest/$f.part"
      return 1
    fi
  fi
  mv "$dest/$f.part" "$dest/$f" || exit 1
}

mkdir -p "$dest"
for f in "${files[@]}"; do
  if ! fetch "$f"; then
    if [[ -n "$mirror" ]]; then
      echo "error: $mirror/$f does not exist (the Multi30k mirror folder)" >&2
    else
      echo "error: could not download $base_url/$f (${why:-curl failed})" >&2
    fi
    exit 2
  fi
done
for f in "${heldout[@]}"; do
  if [[ -z "$mirror" && -n "$why" ]]; then     # a download failed (offline?): do not try the others
    skipped+=("$f")
  elif ! fetch "$f"; then
    skipped+=("$f")
  fi
done
if (( ${#skipped[@]} )); then
  reason="not found"
  [[ -z "$why" ]] || reason="not downloaded ($why)"
  echo "note: held-out test files $reason, skipped: ${skipped[*]}" >&2
fi
echo "Multi30k raw files in $dest" >&2
