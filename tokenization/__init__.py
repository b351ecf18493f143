"""The web tier's and the engine's tokenizer library: tokenizer files only.

Loads a model directory's tokenizer and renders chat templates without
torch and without model weights, so the web process (which tokenizes every
prompt) never imports torch; the engine uses the same functions, so both
sides tokenize alike.
"""
