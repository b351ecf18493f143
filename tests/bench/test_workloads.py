"""Real-text workloads: the shipped prompts, fresh per round, through the chat template."""

from __future__ import annotations

import json

import pytest

from bench.workloads import (
    AUSTEN_EDIT_PASSAGES,
    CHAT_PROMPTS,
    EDIT_PASSAGES,
    PromptPool,
    Workload,
    WorkloadShape,
    build_chat_workload,
    build_edit_workload,
    chat_messages,
    edit_passages,
)


def test_prompt_pool_is_fresh_until_it_runs_out():
    pool = PromptPool(list(range(10)), seed=1)
    first, second = pool.take(4), pool.take(4)
    assert not set(first) & set(second)
    rest = pool.take(2)
    assert sorted(first + second + rest) == list(range(10))
    # Past the end: a new shuffle of the same items.
    assert set(pool.take(10)) == set(range(10))


def test_shipped_chat_prompts_name_their_sources():
    lines = [json.loads(line) for line in CHAT_PROMPTS.read_text().splitlines()]
    assert len(lines) == len(chat_messages()) == 400
    kinds = {line["source"].split(":")[0] for line in lines}
    assert kinds == {"austen", "pydoc", "written"}
    assert len(edit_passages(AUSTEN_EDIT_PASSAGES)) == 100
    assert len(edit_passages(EDIT_PASSAGES)) == 4


@pytest.fixture(scope="module")
def tokenizer():
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from tokenization.tokenizer import load_tokenizer

    return load_tokenizer(str(ensure_demo_model()))


def test_chat_workload_renders_each_message_as_a_user_turn(tokenizer, tmp_path):
    messages = chat_messages()[:3]
    shape = WorkloadShape(3, 0, 0, 16, 32, 0, 0, 0, 0, 0)
    workload = build_chat_workload(tokenizer, messages, shape, vocab_size=49152, seed=3)
    workload.temperature, workload.top_p = 0.8, 0.95
    path = tmp_path / "w.json"
    workload.to_json(path)
    again = Workload.from_json(path)
    assert (again.temperature, again.top_p) == (0.8, 0.95)
    assert len(again.offline) == 3
    for request, message in zip(again.offline, messages, strict=True):
        text = tokenizer.decode(request.prompt_token_ids)
        assert message.strip() in text
        assert text.rstrip().endswith("assistant")
        assert 16 <= request.max_tokens <= 32


def test_edit_workload_takes_the_passages_it_is_given(tokenizer):
    passages = edit_passages(AUSTEN_EDIT_PASSAGES)[:2]
    shape = WorkloadShape(2, 0, 0, 48, 64, 0, 0, 0, 0, 0)
    workload = build_edit_workload(tokenizer, shape, vocab_size=49152, seed=5, passages=passages)
    for request, passage in zip(workload.offline, passages, strict=True):
        text = tokenizer.decode(request.prompt_token_ids)
        assert "correcting its spelling mistakes" in text
        # Most words survive the misspelling.
        words = passage.split()
        assert sum(w in text for w in words) > 0.8 * len(words)
