#!/usr/bin/env bash
# What a GPU machine without a network needs for the GPU figures: bash scripts/gpu_kit.sh fetch|install KIT
# bench/gpu_kit.sh does the work and says how.
exec bash "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../bench/gpu_kit.sh" "$@"
