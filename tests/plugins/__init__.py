"""Shared fixtures as pytest plugins (registered in tests/conftest.py).

A fixture two test packages need lives here, never in a conftest another
conftest imports: ``request_path`` (the demo model row, the in-process
bus), ``fake_worker`` (the one scripted worker), ``engine`` (the real demo
engine and a WorkerLoop around it), ``topology`` (the multi-process
topology as subprocesses), ``asgi_client`` (the raw ASGI driver).
"""
