"""An offensive-language classifier that runs offline on CPU.

The model is alt-profanity-check's (a TF-IDF vectorizer and a calibrated
linear SVM, trained on about 200k labelled comments and shipped inside the
wheel). Its own ``predict_prob`` costs about 10 ms a call whatever the batch
size (scikit-learn's input validation and five calibrated folds), which is
too slow to run on a streamed reply. The model is linear, so it is compiled
once into a table: each vocabulary term maps to its idf and its weight in
every fold, and a score is a sparse dot product over the words of the text,
a few microseconds for a sliding window. ``tests/safety/test_classifier.py``
checks the compiled scores against the library's own.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass

# A word that alone scores this much is worth holding back while it may
# still be growing (safety.stream); about 1,000 of the 15,442 terms.
RISKY_SCORE = 0.3

_lock = threading.Lock()
_model: ProfanityModel | None = None


@dataclass(slots=True, frozen=True)
class _Fold:
    intercept: float
    # Platt scaling of the fold's decision value: 1 / (1 + exp(a * d + b)).
    a: float
    b: float


class ProfanityModel:
    """The compiled classifier: ``score(text)`` is P(offensive) in [0, 1]."""

    __slots__ = ("_terms", "_folds", "_token_re", "_risky")

    def __init__(self, vectorizer, calibrated) -> None:
        folds = calibrated.calibrated_classifiers_
        idf = vectorizer.idf_
        coefs = [fold.estimator.coef_[0] for fold in folds]
        # term -> (idf, weight in fold 0, weight in fold 1, ...)
        self._terms: dict[str, tuple[float, ...]] = {
            term: (float(idf[j]), *(float(c[j]) for c in coefs))
            for term, j in vectorizer.vocabulary_.items()
        }
        self._folds = tuple(
            _Fold(
                float(f.estimator.intercept_[0]),
                float(f.calibrators[0].a_),
                float(f.calibrators[0].b_),
            )
            for f in folds
        )
        # (?u)\b\w\w+\b: linear in Python's engine (a failed start costs one
        # step, a word is consumed once; tests/safety/test_linear.py times it
        # on 1 MB inputs), and a single C call per text, where RE2's
        # wrapper costs microseconds a word on the streamed reply's path.
        self._token_re = re.compile(vectorizer.token_pattern)
        self._risky = frozenset(t for t in self._terms if self.score(t) >= RISKY_SCORE)

    def knows(self, word: str) -> bool:
        """Whether ``word`` is a feature: a word outside the vocabulary cannot move a score."""
        return word.lower() in self._terms

    def risky(self, word: str) -> bool:
        """Whether ``word`` alone scores at least RISKY_SCORE: the words worth holding back."""
        return word.lower() in self._risky

    def score(self, text: str) -> float:
        """P(offensive) of ``text``, as the library's ``predict_prob`` computes it."""
        terms = self._terms
        counts: dict[str, int] = {}
        # Stop words never made it into the vocabulary: the lookup drops them.
        for word in self._token_re.findall(text.lower()):
            if word in terms:
                counts[word] = counts.get(word, 0) + 1
        n_folds = len(self._folds)
        dots = [0.0] * n_folds
        norm = 0.0
        for word, tf in counts.items():
            entry = terms[word]
            x = tf * entry[0]
            norm += x * x
            for k in range(n_folds):
                dots[k] += x * entry[k + 1]
        # TF-IDF rows are L2-normalised; an empty row stays all zeros.
        scale = 1.0 / math.sqrt(norm) if norm else 0.0
        total = 0.0
        for k, fold in enumerate(self._folds):
            decision = dots[k] * scale + fold.intercept
            total += 1.0 / (1.0 + math.exp(fold.a * decision + fold.b))
        return min(1.0, total / n_folds)

    def score_many(self, texts: list[str]) -> list[float]:
        return [self.score(t) for t in texts]


def profanity_model() -> ProfanityModel:
    """The process's compiled model, loaded on first use (about 4 s: scikit-learn)."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                from profanity_check import profanity_check as library

                _model = ProfanityModel(library.vectorizer, library.model)
    return _model


def warm_in_background() -> threading.Thread:
    """Load the model in a daemon thread, so the first request does not wait for it."""
    thread = threading.Thread(target=profanity_model, name="safety-warm", daemon=True)
    thread.start()
    return thread
