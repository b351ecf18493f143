#!/usr/bin/env bash
# The AMX linear kernel at a git revision against the working tree's:
#
#   bash bench/amx_linear_ab/run.sh REV [ROWS]      (ROWS default 24,64,384,1024)
#
# Builds gpuworkers/engine/cpu/amx_linear.cpp (with its headers) from REV
# and from the working tree as the engine does (-O3 -march=native), links
# both into one driver (ab.cpp) and calls them alternately on the demo
# model's shapes (q/k/v 576->960, o 576->576, gate/up 576->3072, down
# 1536->576), 30 rounds, 64-byte aligned inputs; prints the best time per
# call and per 16x16x32 tile product for each, old / new, and MISMATCH if
# the two builds' outputs differ in any bit. Weights stay in cache (one layer), so
# it times the arithmetic, not DRAM: bench.decode_linear does that. Needs
# AMX; set OMP_NUM_THREADS (1 gives the steadiest figures on a shared
# machine). Asserts nothing.
set -euo pipefail
rev=${1:?usage: run.sh REV [ROWS]}
rows=${2:-24,64,384,1024}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/old"
git -C "$root" archive "$rev" gpuworkers/engine/cpu | tar -x -C "$work/old"
flags=(-O3 -march=native -ffast-math -fopenmp -std=c++17)
build() {  # build SUFFIX SOURCE_DIR: the kernel's entry points renamed
  g++ "${flags[@]}" -I"$2" -Damx_linear_bf16="linear_$1" -Damx_linear_supported="supported_$1" \
    -Damx_linear_k_multiple="k_multiple_$1" -Damx_swiglu_bf16="swiglu_$1" \
    -c "$2/amx_linear.cpp" -o "$work/$1.o"
}
build old "$work/old/gpuworkers/engine/cpu"
build new "$root/gpuworkers/engine/cpu"
g++ -O2 -std=c++17 "$root/bench/amx_linear_ab/ab.cpp" "$work/old.o" "$work/new.o" -fopenmp -o "$work/ab"
"$work/ab" "$rev" "$rows"
