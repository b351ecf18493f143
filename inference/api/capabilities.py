"""What each served model offers, as ``/v1/models`` lists it.

One source for the ``features`` clients read: the endpoints every model
serves here, and per model what its chat template allows. ``tools`` is
listed when the request path can render tools for the model
(``inference.tool_calls.template.tools_template``: a template of its own
that renders tools, or a ChatML one, for which ours is used). ``json_schema``: the engine's
grammar-constrained decoding, the same for every model.
"""

from __future__ import annotations

from fleet.models import ServedModel
from fleet.selectors import served_model_dir
from inference.errors import InvalidRequest
from inference.tool_calls.template import tools_template
from tokenization.tokenizer import load_tokenizer

# Served for every model by this request path.
BASE_FEATURES = ("chat", "completions", "responses", "logprobs", "json_schema")


def model_features(model: ServedModel) -> list[str]:
    """The model's features, in a stable order."""
    features = list(BASE_FEATURES)
    try:
        tokenizer = load_tokenizer(str(served_model_dir(model=model)))
        tools_template(tokenizer, model.name)
        features.append("tools")
    except (InvalidRequest, OSError, ValueError):
        # No template for tools, or the model's files are not on this host:
        # tools are not promised.
        pass
    return features
