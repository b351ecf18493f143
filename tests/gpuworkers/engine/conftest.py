"""Engine fixtures: the demo model loaded once, engines built around it.

These tests need no Django and no database; they load the real demo model
(converted from the GGUF file on first use).
"""

from __future__ import annotations

import pytest
import torch

from gpuworkers.engine import EngineConfig, LLMEngine
from gpuworkers.engine.convert_gguf import ensure_demo_model
from gpuworkers.engine.cpu.build import cpu_library
from gpuworkers.engine.models.loader import load_model
from tokenization.tokenizer import apply_chat_template, load_tokenizer

CHAT_PROMPTS = [
    "What is 2 + 2?",
    "Name three primary colors.",
    "Write one sentence about the sea.",
    "Translate 'good morning' into French.",
    "Explain in a few words what a compiler does, and why programmers use one every day.",
    "Give me a short list of fruits that are red.",
    "Hi!",
    "Describe a cat to someone who has never seen one, using simple words and short sentences.",
]


@pytest.fixture(scope="session")
def demo_dir():
    return ensure_demo_model()


@pytest.fixture(scope="session")
def fp32_model(demo_dir):
    torch.set_num_threads(2)
    return load_model(demo_dir, "float32", "cpu", 2048)


@pytest.fixture(scope="session")
def tokenizer(demo_dir):
    return load_tokenizer(str(demo_dir))


@pytest.fixture(scope="session")
def chat_prompts(tokenizer):
    return [apply_chat_template(tokenizer, [{"role": "user", "content": p}]) for p in CHAT_PROMPTS]


@pytest.fixture(scope="session")
def make_engine(fp32_model, tokenizer, demo_dir):
    """Build an engine over the shared float32 weights with chosen settings."""
    model, model_cfg = fp32_model

    def build(**options) -> LLMEngine:
        options.setdefault("num_kv_blocks", 256)
        options.setdefault("num_host_blocks", 256)
        config = EngineConfig(
            model_dir=str(demo_dir), model_id="demo", dtype="float32", max_model_len=2048, **options
        )
        return LLMEngine(config, model, model_cfg, tokenizer)

    return build


@pytest.fixture(scope="module")
def library():
    lib = cpu_library()
    # gcc is on every machine kind this project runs on (docs/engine.md); a
    # missing compiler here is a set-up fault worth failing on, not skipping.
    assert lib is not None, "the CPU decode kernel did not build"
    return lib
