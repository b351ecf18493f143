"""Tokenizer loading is safe from many threads on a fresh process."""

from __future__ import annotations

import subprocess
import sys

# A fresh interpreter, so transformers is imported for the first time by
# the racing threads themselves, as on a web process's first requests.
RACE = """
import sys, threading
from tokenization.tokenizer import load_tokenizer
barrier = threading.Barrier(8)
loaded, errors = [], []
def load():
    barrier.wait()
    try:
        loaded.append(load_tokenizer(sys.argv[1]))
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(loaded), len({id(t) for t in loaded}), errors)
"""


def test_concurrent_first_loads_share_one_tokenizer_and_never_fail(demo_dir):
    out = subprocess.run(
        [sys.executable, "-c", RACE, str(demo_dir)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # Eight loads, one tokenizer object, no error.
    assert out.stdout.split("\n")[-2] == "8 1 []"
