"""What each served model offers, as ``/v1/models`` lists it.

One source per model for the ``features`` clients read: the endpoints every
model serves here, plus features that switch on per model once they are
built (tool calls, JSON-schema output). A feature is listed only when the
request path implements it.
"""

from __future__ import annotations

# Served for every model by this request path.
BASE_FEATURES = ("chat", "completions", "responses", "logprobs")

# Switched on here, per model name (None: every model), when implemented.
OPTIONAL_FEATURES: dict[str, frozenset[str] | None] = {
    "tools": frozenset(),
    "json_schema": frozenset(),
}


def model_features(model_name: str) -> list[str]:
    """The model's features, in a stable order."""
    extra = [
        feature
        for feature, models in OPTIONAL_FEATURES.items()
        if models is None or model_name in models
    ]
    return [*BASE_FEATURES, *extra]
