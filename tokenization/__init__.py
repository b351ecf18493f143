"""The web tier's and the engine's tokenizer library: tokenizer files only.

Loads a model directory's tokenizer and renders chat templates without
torch and without model weights, so the web process (which tokenizes every
prompt) never imports torch; the engine uses the same functions, so both
sides tokenize alike.
"""

from tokenization.files import (
    DEMO_NAME,
    ModelFilesMissing,
    cache_root,
    converted_demo_dir,
    demo_model_dir,
)
from tokenization.tokenizer import apply_chat_template, eos_token_ids, load_tokenizer

__all__ = [
    "DEMO_NAME",
    "ModelFilesMissing",
    "apply_chat_template",
    "cache_root",
    "converted_demo_dir",
    "demo_model_dir",
    "eos_token_ids",
    "load_tokenizer",
]
