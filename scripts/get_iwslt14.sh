#!/usr/bin/env bash
# Fetch the IWSLT 2014 German-English release and extract train/valid/test the standard way
# (fairseq's examples/translation/prepare-iwslt14.sh, which Joey NMT's IWSLT14 recipes follow).
#
#   scripts/get_iwslt14.sh [DEST]                          download de-en.tgz
#   IWSLT14_MIRROR=/path scripts/get_iwslt14.sh [DEST]     copy /path/de-en.tgz from a local mirror
#   scripts/get_iwslt14.sh --mirror /path [DEST]
#
# DEST defaults to data/iwslt14; it gets train/valid/test.{de,en} (raw text, lowercased) and
# orig/ (the release). See scripts/prepare_iwslt14.py for the extraction and cleaning steps.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/script_usage.sh"   # beside this file, links followed

mirror="${IWSLT14_MIRROR:-}"
if [[ "${1:-}" == "--mirror" ]]; then
  [[ -n "${2:-}" ]] || usage_error "--mirror needs a folder"
  mirror="$2"
  shift 2
fi
[[ $# -le 1 && "${1:-}" != -* ]] || usage_error "takes [--mirror FOLDER] [DEST], got '$*'"
dest="${1:-data/iwslt14}"
url="http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$dest/orig"
archive="$dest/orig/de-en.tgz"
if [[ ! -s "$archive" ]]; then
  if [[ -n "$mirror" ]]; then
    [[ -f "$mirror/de-en.tgz" ]] || { echo "error: $mirror/de-en.tgz does not exist (IWSLT14_MIRROR)" >&2; exit 1; }
    cp "$mirror/de-en.tgz" "$archive.part"
  else
    curl -fsSL --retry 3 -o "$archive.part" "$url"
  fi
  mv "$archive.part" "$archive"
fi
tar -xzf "$archive" -C "$dest/orig"
"${PYTHON:-python3}" "$here/prepare_iwslt14.py" "$dest/orig/de-en" "$dest"
echo "IWSLT14 de-en in $dest: train, valid, test" >&2
