"""The rules of sampling that both sides of the wire obey.

One set of limits (``limits``), the error a broken rule raises and the
checks of a request's sampling settings, and the structured-output spec
(``structured``). Plain Python: the web tier checks a request against these
before anything is enqueued, the engine checks its ``SamplingParams``
against the same, and neither imports the other.
"""
