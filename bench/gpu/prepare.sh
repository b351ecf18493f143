#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device check: puts what
# bench/gpu/check.py needs into two git-excluded folders that the device
# tool's `carry` takes along (64 MiB a call in all; nothing can be fetched
# there):
#   .whl/        FlashInfer as pinned in pyproject.toml (a JIT wheel: kernels
#                compile with the machine's nvcc on first use), the two
#                dependencies the machine's image lacks, and llguidance at
#                the version the venv has (the engine's warm-up prepares
#                its grammar compiler; its wheel is manylinux_2_31). nvidia-cutlass-dsl
#                (59 MB) is left out: only FlashInfer's CuTe-DSL kernels
#                import it, not the paged prefill/decode wrappers used here.
#   .gpu-model/  the demo model's config and tokenizer. Its weights (98 MB
#                as GGUF) cannot travel: check.py fills the model with
#                seeded random weights, which is enough to compare two
#                attention backends and to time them.
#
# Then, with the device tool:
#   run(command="bash bench/gpu/check.sh", carry=[".whl", ".gpu-model"], timeout_s=540)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
for folder in /.whl/ /.gpu-model/; do
    grep -qxF "$folder" .git/info/exclude 2>/dev/null || echo "$folder" >>.git/info/exclude
done
VERSION="$(sed -n 's/^flashinfer = \["flashinfer-python==\(.*\)"\]/\1/p' pyproject.toml)"
rm -rf .whl && mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d .whl \
    "flashinfer-python==$VERSION" "apache-tvm-ffi==0.1.11" "nvidia-cudnn-frontend==1.16.0"
source bin/setup >/dev/null
LLGUIDANCE="$(python -c 'import importlib.metadata as m; print(m.version("llguidance"))')"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" --platform manylinux_2_31_x86_64 -d .whl \
    "llguidance==$LLGUIDANCE"
MODEL="$(python -c 'from gpuworkers.engine.convert_gguf import ensure_demo_model; print(ensure_demo_model())')"
rm -rf .gpu-model && mkdir -p .gpu-model
cp "$MODEL"/config.json "$MODEL"/generation_config.json "$MODEL"/tokenizer* .gpu-model/
cp "$MODEL"/chat_template.jinja .gpu-model/ 2>/dev/null || true
du -sh .whl .gpu-model
