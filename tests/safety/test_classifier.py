"""The compiled classifier scores exactly as alt-profanity-check's own model."""

import pytest
from profanity_check import predict_prob

from safety.checks.classifier import profanity_model
from safety.moderation import classifier_score

TEXTS = [
    "you are a fucking idiot",
    "hello there friend, how was the trip?",
    "Here is a recipe: boil water, add salt and cook the pasta for ten minutes.",
    "go to hell you bastard",
    "",
    "the the the",
    "Shit happens.",
    "The assignment for the class is due on Monday.",
]


def test_compiled_scores_equal_the_library_predict_prob():
    model = profanity_model()
    expected = predict_prob(TEXTS)
    assert [model.score(t) for t in TEXTS] == pytest.approx(list(expected), abs=1e-9)


def test_offensive_text_scores_high_and_ordinary_text_low():
    model = profanity_model()
    assert model.score("you are a fucking idiot") > 0.95
    assert model.score("The assignment for the class is due on Monday.") < 0.1


def test_a_long_text_is_judged_on_windows_so_one_insult_is_not_diluted():
    """One insult in 200 ordinary words: the whole text's TF-IDF row dilutes
    it; the highest window does not."""
    filler = "we walked along the river and talked about the weather and the garden " * 15
    text = filler + " you are a fucking idiot " + filler
    assert profanity_model().score(text) < 0.8
    assert classifier_score(text) > 0.95
