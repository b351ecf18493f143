"""The test run's settings (pytest-django, pyproject.toml): local mode, plus
what only tests want. The environment of the run itself (local mode, a
secret, no tokenizer warm-up thread) is set by ``tests/settings_env.py``
before this loads, so subprocesses the tests start inherit it too.
"""

from config.settings.local import *  # noqa: F403

# Users are created by the hundred; the default hasher costs a quarter of a
# second per password on the test machines. Nothing here tests hashing.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
