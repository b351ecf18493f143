"""The error a sampling setting out of range raises, on either side."""


class InvalidSamplingParams(ValueError):
    """A sampling setting out of range; ``param`` names the offending field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class TokenIdOutOfVocabulary(InvalidSamplingParams):
    """A token id the model's vocabulary does not have."""
