#!/usr/bin/env bash
# Run ON the GPU machine (see bench/gpu/prepare.sh for how it gets there):
# installs the carried wheels, then bench/gpu/check.py writes its figures
# to $OUT (or bench/results/ when $OUT is unset).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, flashinfer; print("torch", torch.__version__, "flashinfer", flashinfer.__version__)'
python3 -m bench.gpu.check --model-src .gpu-model --out "${OUT:-bench/results}/gpu-check.json" 2>&1 \
    | tee "${OUT:-/tmp}/gpu-check.log"
