"""Per-request sampling data, derived once when a request is added."""

from __future__ import annotations

from gpuworkers.engine.sampling.masks import tokenize_bad_words


def prepare_request(
    request, tokenizer, vocab_size: int, eos_token_ids: list[int], grammars=None
) -> None:
    """Check ``request.params`` against the model and fill the request's
    derived sampling fields (``sequence.Request``: stop_ids, min_tokens_ids,
    bad_words_ids, prompt_logprobs, grammar).

    Raises:
        InvalidSamplingParams: a token id outside the model's vocabulary, or
            a structured_output grammar that does not compile for it
            (``grammars``: the engine's ``structured.GrammarCompiler``).
    """
    params = request.params
    params.check_vocab(vocab_size)
    eos = () if params.ignore_eos else tuple(eos_token_ids)
    request.stop_ids = frozenset((*params.stop_token_ids, *eos))
    if params.min_tokens:
        # EOS too under ignore_eos, as vLLM: min_tokens means "not yet".
        request.min_tokens_ids = tuple(dict.fromkeys((*params.stop_token_ids, *eos_token_ids)))
    if params.bad_words:
        words = tokenize_bad_words(tokenizer, params.bad_words)
        # A tokenizer may know ids the model has no logits for (added tokens).
        request.bad_words_ids = tuple(w for w in words if max(w) < vocab_size)
    if params.structured_output is not None:
        request.grammar = grammars.compile(params.structured_output)
    if params.prompt_logprobs is not None:
        request.prompt_logprobs = [None]
