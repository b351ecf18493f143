"""bench.hostile's own parts: the silent listener counts, the probes cover issue 28."""

import socket
import time

from bench.hostile import SilentListener, probes


def test_the_silent_listener_counts_connections_and_never_answers():
    listener = SilentListener()
    try:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=2) as conn:
            conn.settimeout(0.2)
            try:
                answered = conn.recv(1)
            except TimeoutError:
                answered = None
        assert answered is None
        deadline = time.monotonic() + 2
        while listener.count < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.count == 1
    finally:
        listener.close()


def test_the_probes_are_issue_28s_hostile_requests():
    names = [name for name, _, _ in probes()]
    assert len(names) == len(set(names))
    for expected in ("chat_percent_100k", "tool_ref_http", "nul_in_model", "moderations_oversize"):
        assert expected in names
