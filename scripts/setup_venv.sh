# Sourced by quickstart.sh and best_recipe.sh from the repository root: make and activate .venv, install
# torch (the CPU build pinned for this project, if none is present) and nmt, and use
# ../shared/data/multi30k as the Multi30k mirror when it exists and MULTI30K_MIRROR is unset.
# NMT_SKIP_VENV=1 uses the python and nmt already on PATH instead (the tests do).
if [[ "${NMT_SKIP_VENV:-}" != 1 ]]; then
  if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  source .venv/bin/activate
  python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
  # The `nmt` command, not `import nmt`: from the repository root the package imports without being installed.
  [[ -x .venv/bin/nmt ]] || pip install -q -c constraints.txt -e .
fi

if [[ -z "${MULTI30K_MIRROR:-}" && -d ../shared/data/multi30k ]]; then
  export MULTI30K_MIRROR=../shared/data/multi30k
fi
