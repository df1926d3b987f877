#!/usr/bin/env bash
# What a GPU machine that reaches no network needs beyond the checkout, to run bench/gpu_benchmarks.sh:
#
#   bash scripts/gpu_kit.sh fetch KIT    # here, with the package index: wheels for the GPU machine's Python
#   bash scripts/gpu_kit.sh install KIT  # there: installs them under /tmp/gpu-kit, then
#   source /tmp/gpu-kit/env.sh           # PYTHONPATH (this checkout, the wheels), PATH (`nmt`), ONMT
#
# The GPU image's Python (PY_VERSION, default 3.12) has a CUDA torch and nmt's dependencies (sentencepiece,
# sacrebleu, typer, pyyaml, tqdm, numpy, safetensors, pytest, hypothesis); nmt runs from the checkout. What
# it lacks is OpenNMT-py 3.5.1 for the side-by-side stages: its wheel and the packages its modules import
# (onmt's metadata pins torch<2.3, so it goes in without its dependencies, as ../shared/peers/opennmt-setup.sh
# does, with the same patches). KIT must travel with the checkout: keep it in an ignored folder (.gpu/ is)
# and carry it. The Multi30k data folder travels the same way (carry `data`, made by `nmt preprocess`).
# PYTHON picks the interpreter `install` uses (default python3); its `python` then comes first on PATH.
set -euo pipefail
# shellcheck source=scripts/script_usage.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../scripts/script_usage.sh"   # links followed
[[ $# -eq 2 && ( "$1" == fetch || "$1" == install ) && "$2" != -* ]] \
  || usage_error "takes fetch KIT or install KIT, got '$*'"
repo="$(cd "$(dirname "$0")/.." && pwd)"
kit="$2"
python="${PYTHON:-python3}"
target=/tmp/gpu-kit

# OpenNMT-py 3.5.1 and what its modules import at start-up that the GPU image does not hold (versions
# that ran with it); spacy, fasttext, ctranslate2, flask and waitress serve features the benchmarks skip.
WHEELS=(OpenNMT-py==3.5.1 ConfigArgParse==1.9.0 pyonmttok==1.38.1 RapidFuzz==3.14.6 pyahocorasick==2.3.1)

fetch() {
  mkdir -p "$kit/wheels"
  local platforms=()
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
  done
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
    --implementation cp "${platforms[@]}" -d "$kit/wheels" "${WHEELS[@]}"
  ls "$kit/wheels"
}

install() {
  compgen -G "$kit/wheels/*.whl" > /dev/null \
    || { echo "error: gpu_kit.sh install: $kit/wheels holds no wheels (bash scripts/gpu_kit.sh fetch $kit)" >&2; exit 2; }
  [[ "$(realpath "$kit")/" != "$target/"* ]] \
    || { echo "error: gpu_kit.sh install: KIT must lie outside $target, which install replaces" >&2; exit 2; }
  local py build
  py="$("$python" -c 'import sys; print(sys.executable)')"          # absolute, as the wrappers need it
  build="$target.new.$$"                                                # swapped in whole, or not at all
  rm -rf "$build"
  mkdir -p "$build/bin" "$build/onmt/bin"
  "$py" -m pip install -q --no-index --find-links "$kit/wheels" --no-deps --no-compile --no-cache-dir \
    --target "$build/site" "${WHEELS[@]}"
  local onmt="$build/site/onmt"
  # spacy and fasttext are imported at the top of optional transforms: optional here too
  sed -i 's/^import spacy$/try:\n    import spacy\nexcept ImportError:\n    spacy = None/' "$onmt/transforms/terminology.py"
  sed -i 's/^import fasttext$/try:\n    import fasttext\nexcept ImportError:\n    fasttext = None/' \
    "$onmt/transforms/clean.py"
  # torch >= 2.6 loads weights only by default; OpenNMT-py's checkpoints pickle their vocabulary and options
  sed -i 's/torch.load(ckpt_path, map_location=torch.device("cpu"))/torch.load(ckpt_path, map_location=torch.device("cpu"), weights_only=False)/' \
    "$onmt/models/model_saver.py"
  sed -i 's/torch.load(transforms_path)/torch.load(transforms_path, weights_only=False)/' "$onmt/transforms/transform.py"
  for name in build_vocab train translate; do
    printf '#!/bin/sh\nexec "%s" -c "import sys; from onmt.bin.%s import main; sys.argv[0] = \\"onmt_%s\\"; main()" "$@"\n' \
      "$py" "$name" "$name" > "$build/onmt/bin/onmt_$name"
  done
  printf '#!/bin/sh\nexec "%s" -m nmt "$@"\n' "$py" > "$build/bin/nmt"
  # the scripts' `python` is the one the wrappers run (a wrapper, not a link: a venv's python finds its
  # packages from the path it was started by)
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$py" | tee "$build/bin/python" > "$build/bin/python3"
  chmod +x "$build/bin/"* "$build/onmt/bin/"onmt_*
  cat > "$build/env.sh" <<EOF
export PYTHONPATH="$repo:$target/site\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$target/bin:\$PATH" ONMT="$target/onmt" PYTHONUNBUFFERED=1
EOF
  rm -rf "$target"
  mv "$build" "$target"
  # shellcheck disable=SC1091
  source "$target/env.sh"
  "$target/onmt/bin/onmt_train" -h > /dev/null
  nmt --help > /dev/null
  echo "installed: source $target/env.sh"
}

"$1"
