"""Console fixtures: the fake worker of tests/plugins, warmed for sockets."""

from __future__ import annotations

import pytest

from fleet.selectors import served_model_dir
from tokenization import load_tokenizer


@pytest.fixture
def fake_worker(fake_worker, demo_model):
    """The plugin's ``fake_worker`` (``tokens``, ``interval``: the console's
    tests pace replies so a socket can stop, drop or resume one midway),
    with the demo model's tokenizer loaded first: the first load takes
    seconds on a busy machine, which must not count against a socket read."""
    load_tokenizer(served_model_dir(model=demo_model))
    return fake_worker
