"""Where converted models live, and what a model directory must hold to be read.

The demo model is converted once from its GGUF file into a Hugging Face
directory by set-up (``bin/setup``, the Docker image) or by the worker that
serves it (``gpuworkers.engine.convert_gguf``); the web tier only reads the
tokenizer files there and never converts anything itself.
"""

from __future__ import annotations

import os
from pathlib import Path

DEMO_NAME = "smollm2-135m-instruct"
# Written last by the conversion, so a directory without it is a conversion
# that died midway (or one still running).
COMPLETE_MARKER = ".converted"


class ModelFilesMissing(FileNotFoundError):
    """A model directory without the files this process needs (yet)."""


def cache_root() -> Path:
    """Where converted models live: $LLM_MODEL_CACHE or ~/.cache/llm-platform/models."""
    env = os.environ.get("LLM_MODEL_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "llm-platform" / "models"


def demo_model_dir() -> Path:
    return cache_root() / DEMO_NAME


def converted_demo_dir() -> Path:
    """The demo model's directory once its conversion is complete.

    Raises ModelFilesMissing (saying how to make it) before then: the web
    tier waits for set-up or the worker instead of converting in a request.
    """
    directory = demo_model_dir()
    if not (directory / COMPLETE_MARKER).exists():
        raise ModelFilesMissing(
            f"The demo model is not converted yet ({directory}): run bin/setup, or "
            "`python -m gpuworkers.engine.convert_gguf`, or start a worker that serves it."
        )
    return directory
