#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md: bash scripts/gpu_benchmarks.sh OUT [MODEL]
# bench/gpu_benchmarks.sh does the work and says what each stage measures.
exec bash "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../bench/gpu_benchmarks.sh" "$@"
