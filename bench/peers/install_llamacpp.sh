#!/usr/bin/env bash
# Build llama.cpp's native tools and the demo model in its GGUF formats under
# the git-ignored .peers/llamacpp/, for bench.quant's single-stream
# comparison. Idempotent: what already exists is kept.
#
#   bash bench/peers/install_llamacpp.sh    # about 6 min on 2 cores
#
# The sources come from PyPI's llama-cpp-python sdist (it vendors llama.cpp;
# GitHub is not reachable here). Only the C++ tools are built
# (llama-bench, llama-quantize, llama-perplexity), natively for this CPU.
# The model: our converted demo model (the Hugging Face directory set-up
# makes) converted with llama.cpp's own convert_hf_to_gguf.py to bf16, then
# llama-quantize to Q8_0 and Q4_0. Prints the folder on the last line.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="$ROOT/.peers/llamacpp"
SRC="$DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
BIN="$SRC/build/bin"
MODEL_DIR="${MODEL_DIR:-$HOME/.cache/llm-platform/models/smollm2-135m-instruct}"
PY="$ROOT/.venv/bin/python"

mkdir -p "$DIR/gguf"
cd "$DIR"

if [[ ! -d "$SRC" ]]; then
    echo "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION's sources" >&2
    "$PY" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$DIR" >&2
    tar xzf "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
fi

if [[ ! -x "$BIN/llama-bench" || ! -x "$BIN/llama-quantize" || ! -x "$BIN/llama-perplexity" ]]; then
    echo "building llama.cpp's tools (a few minutes)" >&2
    cmake -S "$SRC" -B "$SRC/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release >&2
    cmake --build "$SRC/build" -j"$(nproc)" \
        --target llama-bench llama-quantize llama-perplexity >&2
fi

if [[ ! -f gguf/smollm2-bf16.gguf ]]; then
    # Its Llama converter imports sentencepiece before it looks for a
    # tokenizer.model (then falls back to the BPE tokenizer.json ours has):
    # installed beside it, not in the project's venv.
    [[ -d pydeps/sentencepiece ]] || "$PY" -m pip install --quiet --target pydeps sentencepiece >&2
    echo "converting the demo model to GGUF bf16" >&2
    PYTHONPATH="$SRC/gguf-py:$DIR/pydeps" "$PY" "$SRC/convert_hf_to_gguf.py" "$MODEL_DIR" \
        --outtype bf16 --outfile gguf/smollm2-bf16.gguf >&2
fi
for kind in Q8_0 Q4_0; do
    if [[ ! -f "gguf/smollm2-$kind.gguf" ]]; then
        "$BIN/llama-quantize" gguf/smollm2-bf16.gguf "gguf/smollm2-$kind.gguf" "$kind" >&2
    fi
done
echo "$DIR"
