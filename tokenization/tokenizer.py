"""Tokenizer loading and chat templating, shared by the engine and the web tier.

The web process tokenizes prompts itself (context caps and token counts are
enforced before any GPU work), so this module reads tokenizer files only and
never imports torch. transformers' ``AutoTokenizer`` would: resolving a
tokenizer class goes through its model configuration code, which imports
torch. Fast tokenizers are defined wholly by ``tokenizer.json`` (plus
``tokenizer_config.json`` for special tokens and the chat template), which
``TokenizersBackend``, the class ``AutoTokenizer`` returns for them, loads
without it.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from pathlib import Path

# The first load of each tokenizer happens under one lock, and imports
# transformers' tokenizer module by its full path. Two request threads
# resolving names through transformers' lazy top-level module at once have
# seen it half-initialised ("cannot import name 'AutoModelForCausalLM' from
# 'transformers'" on a fresh web process taking concurrent requests).
_load_lock = threading.Lock()


def load_tokenizer(model_dir: str | Path):
    """Load the fast tokenizer of a model directory (cached, thread-safe)."""
    with _load_lock:
        return _load_tokenizer(str(model_dir))


@lru_cache(maxsize=8)
def _load_tokenizer(model_dir: str):
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    return TokenizersBackend.from_pretrained(model_dir)


def apply_chat_template(
    tokenizer,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    chat_template: str | None = None,
) -> list[int]:
    """Render OpenAI-style ``messages`` with the model's template and tokenize.

    ``tools`` (OpenAI's tool definitions) go to the template as Hugging
    Face's ``tools``; ``chat_template`` replaces the model's own template.
    Returns the prompt token ids, ending with the assistant generation prompt.
    """
    encoded = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    # transformers 5 may return a BatchEncoding-like mapping even when asked
    # for a plain list; accept both shapes.
    if hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return list(encoded)


def eos_token_ids(tokenizer, model_dir: str | Path) -> list[int]:
    """All end-of-sequence ids: the tokenizer's plus generation_config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_path = Path(model_dir) / "generation_config.json"
    if gen_path.exists():
        eos = json.loads(gen_path.read_text()).get("eos_token_id")
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(e) for e in eos)
    return sorted(ids)
