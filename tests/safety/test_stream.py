"""The streamed-reply screen: a sliding window over the text, cut or hold per event."""

from safety.checks import CLASSIFIER, DENY_LIST
from safety.policy import Action, Policy
from safety.stream import ReplyScreen
from wire.events import ChoiceDelta, Delta

DENY = Policy(classifier=Action.OFF, deny=Action.BLOCK, deny_terms=("blue whale",))
CLASSIFIER_ONLY = Policy(classifier=Action.BLOCK, threshold=0.8, deny=Action.OFF)


def deltas(*texts: str) -> list[dict]:
    return [Delta(i + 2, (ChoiceDelta(0, t, (i,)),)) for i, t in enumerate(texts)]


def run(screen: ReplyScreen, events: list[dict]) -> tuple[list[str], object]:
    """The texts released before a cut (or the end), and the cut finding."""
    shown = []
    for event in events:
        result = screen.feed(event)
        shown += [e.choices[0].text for e in result.release]
        if result.cut is not None:
            return shown, result.cut
    result = screen.finish()
    shown += [e.choices[0].text for e in result.release]
    return shown, result.cut


def test_a_deny_term_split_across_tokens_is_cut_before_its_last_token_is_sent():
    shown, cut = run(ReplyScreen(DENY), deltas("I saw a ", "bl", "ue wh", "ale", " today."))
    assert cut is not None and cut.check == DENY_LIST and cut.category == "blue whale"
    # "ale" completes the term but is held (the word might go on); the
    # space after it confirms the match, and neither is ever sent.
    assert "".join(shown) == "I saw a blue wh"


def test_a_held_prefix_that_grows_into_another_word_is_released():
    """ "blue whale" at the end of the window is held; "blue whales" is no match."""
    shown, cut = run(ReplyScreen(DENY), deltas("a blue ", "whale", "s swim"))
    assert cut is None
    assert shown == ["a blue ", "whale", "s swim"]


def test_holding_delays_only_the_suspicious_event():
    screen = ReplyScreen(DENY)
    events = deltas("a blue ", "whale", "s swim")
    assert len(screen.feed(events[0]).release) == 1
    assert screen.feed(events[1]).release == []  # held
    assert len(screen.feed(events[2]).release) == 2  # released with the next


def test_the_classifier_cuts_an_insult_split_across_tokens():
    shown, cut = run(
        ReplyScreen(CLASSIFIER_ONLY),
        deltas("Sure.", " You are", " a fu", "cking", " idiot", " and more"),
    )
    assert cut is not None and cut.check == CLASSIFIER and cut.score >= 0.8
    assert "cking" not in "".join(shown)
    assert "".join(shown).startswith("Sure. You are")


def test_a_clean_reply_passes_unchanged():
    texts = ["The assign", "ment of ", "the class", " is due ", "Monday."]
    shown, cut = run(ReplyScreen(CLASSIFIER_ONLY), deltas(*texts))
    assert cut is None and shown == texts


def test_a_violation_in_the_last_token_is_cut_at_the_end():
    shown, cut = run(ReplyScreen(DENY), deltas("Look, a blue ", "whale"))
    assert cut is not None
    assert shown == ["Look, a blue "]


def test_flag_only_findings_are_reported_once_and_nothing_is_cut():
    policy = Policy(classifier=Action.OFF, deny=Action.FLAG, deny_terms=("whale",))
    screen = ReplyScreen(policy)
    flags = []
    for event in deltas("a whale ", "and a whale ", "and more whales"):
        result = screen.feed(event)
        assert result.cut is None and len(result.release) == 1
        flags += result.flags
    assert [(f.check, f.category) for f in flags] == [(DENY_LIST, "whale")]


def test_the_window_slides_and_the_same_events_cut_at_the_same_place():
    """Deterministic: two readers of one response agree on the cut."""
    texts = ["word " * 60, "then a blue ", "whale", " here"]
    first = run(ReplyScreen(DENY), deltas(*texts))
    second = run(ReplyScreen(DENY), deltas(*texts))
    assert first == second and first[1] is not None
