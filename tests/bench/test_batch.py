"""bench.batch's arithmetic: token times from a stream, the worker counter's
interpolation and its steady rate. No topology: plain figures in, figures out."""

from bench.batch import Counter, token_times, tokens_between
from bench.load import Client


def test_token_times_place_a_chunks_tokens_by_its_gaps():
    client = Client(0, first_token=10.0, tokens=4, gaps=[0.5, 0.25, 0.25])
    assert token_times(client) == [10.0, 10.5, 10.75, 11.0]
    # A first chunk of two tokens: both at the first token's time.
    client = Client(1, first_token=5.0, tokens=3, gaps=[1.0])
    assert token_times(client) == [5.0, 5.0, 6.0]
    assert token_times(Client(2)) == []
    assert tokens_between([Client(0, first_token=10.0, tokens=2, gaps=[1.0])], 10.5, 12) == 1


def test_the_counter_interpolates_and_measures_the_steady_middle():
    counter = Counter(topology=None)
    # 100 tokens before the phase; then 10 tok/s for 2 s, 100 tok/s for 8 s.
    counter.samples = [(0.0, 100.0), (2.0, 120.0), (10.0, 920.0)]
    assert counter.at(1.0) == 110.0
    assert counter.at(6.0) == 520.0
    # 10% of 820 tokens is reached at 2.62 s, 90% at 9.18 s: the slow start
    # is outside the middle, whose rate is the 100 tok/s stretch's.
    assert round(counter.steady_rate(100.0, 820.0), 1) == 100.0
    assert counter.steady_rate(100.0, 10_000.0) is None
