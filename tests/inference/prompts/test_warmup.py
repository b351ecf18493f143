"""The web process loads the active models' tokenizers at start (inference.prompts.warmup)."""

import logging

import pytest

from fleet.services import served_model_register
from inference.prompts.warmup import tokenizers_warm_in_background
from tokenization import tokenizer as tokenizers

# Its thread queries with a connection of its own: the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


def test_warm_up_loads_each_active_model_and_logs_one_that_fails(demo_model, caplog):
    broken = served_model_register(name="broken-model", context_length=2048)
    broken.path = "/nonexistent/model-dir"
    broken.save(update_fields=["path"])
    tokenizers._load_tokenizer.cache_clear()

    with caplog.at_level(logging.INFO, logger="inference.prompts.warmup"):
        tokenizers_warm_in_background().join(120)

    # The demo model's tokenizer is cached: the first request finds it loaded.
    assert tokenizers._load_tokenizer.cache_info().currsize == 1
    messages = [r.getMessage() for r in caplog.records]
    assert "tokenizer warm-up: broken-model did not load" in messages
    assert "tokenizer warm-up: 1 loaded" in messages


def test_an_inactive_model_is_not_loaded(demo_model):
    demo_model.is_active = False
    demo_model.save(update_fields=["is_active"])
    tokenizers._load_tokenizer.cache_clear()

    tokenizers_warm_in_background().join(120)

    assert tokenizers._load_tokenizer.cache_info().currsize == 0
