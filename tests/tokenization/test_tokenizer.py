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


LIGHT = """
import sys
from tokenization import apply_chat_template, load_tokenizer
tokenizer = load_tokenizer(sys.argv[1])
ids = apply_chat_template(tokenizer, [{"role": "user", "content": "Hi"}])
assert ids and tokenizer.decode(ids).endswith("assistant\\n")
print(sorted(m for m in ("torch", "safetensors.torch") if m in sys.modules))
"""


def test_loading_and_templating_never_import_torch(demo_dir):
    """The web tier tokenizes every prompt: tokenizer files only, no torch."""
    out = subprocess.run(
        [sys.executable, "-c", LIGHT, str(demo_dir)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[]"
