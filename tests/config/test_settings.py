"""Settings from the environment: production-safe unless told otherwise.

Each case runs a fresh interpreter with exactly the environment it names
(the test run itself is in local mode, tests/settings_env.py).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRODUCTION = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "llm.example.test",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://llm.example.test",
    "DATABASE_URL": "postgres://llm:pw@db.invalid:5432/llm",
    "REDIS_URL": "redis://redis.invalid:6379/0",
    "REDIS_USERNAME": "web",
    "REDIS_PASSWORD": secrets.token_hex(16),
}

SHOW = """
import json, django
django.setup()
from django.conf import settings as s
print(json.dumps({
    "DEBUG": s.DEBUG, "ALLOWED_HOSTS": s.ALLOWED_HOSTS,
    "SESSION_COOKIE_SECURE": s.SESSION_COOKIE_SECURE, "CSRF_COOKIE_SECURE": s.CSRF_COOKIE_SECURE,
    "SECURE_SSL_REDIRECT": s.SECURE_SSL_REDIRECT, "SECURE_HSTS_SECONDS": s.SECURE_HSTS_SECONDS,
    "validators": len(s.AUTH_PASSWORD_VALIDATORS), "REDIS_URL": s.REDIS_URL,
    "CELERY_BROKER_URL": s.CELERY_BROKER_URL, "ADMIN_URL": s.ADMIN_URL,
}))
"""


def run(
    args: list[str], env: dict[str, str], module: str = "config.settings"
) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    base["DJANGO_SETTINGS_MODULE"] = module
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def settings_under(env: dict[str, str], module: str = "config.settings") -> dict:
    done = run(["-c", SHOW], env, module)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_with_production_settings():
    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout
    assert "WARNING" not in done.stdout + done.stderr.replace("WARNING Memory", "")


def test_production_defaults_are_safe():
    shown = settings_under(PRODUCTION)
    assert shown["DEBUG"] is False
    assert shown["ALLOWED_HOSTS"] == ["llm.example.test"]
    assert shown["SESSION_COOKIE_SECURE"] and shown["CSRF_COOKIE_SECURE"]
    assert shown["SECURE_SSL_REDIRECT"] and shown["SECURE_HSTS_SECONDS"] >= 31_536_000
    assert shown["validators"] >= 4
    # The ACL user reaches every Redis client through the URL.
    password = PRODUCTION["REDIS_PASSWORD"]
    assert shown["REDIS_URL"] == f"redis://web:{password}@redis.invalid:6379/0"
    assert shown["CELERY_BROKER_URL"] == shown["REDIS_URL"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"DJANGO_ALLOWED_HOSTS": None}, "Set DJANGO_ALLOWED_HOSTS"),
        ({"DJANGO_ALLOWED_HOSTS": "*"}, "must not contain '*'"),
        ({"REDIS_PASSWORD": None}, "Redis needs ACL credentials"),
        ({"DJANGO_ENV": "staging"}, "DJANGO_ENV must be production or local"),
    ],
)
def test_production_refuses_to_start_without_what_it_needs(change, message):
    env = {k: v for k, v in {**PRODUCTION, **change}.items() if v is not None}
    done = run(["manage.py", "check"], env)
    assert done.returncode != 0 and message in done.stderr


def test_web_and_celery_refuse_to_start_without_a_secret_key(tmp_path):
    env = {k: v for k, v in PRODUCTION.items() if k != "DJANGO_SECRET_KEY"}
    web = run(["-c", "import config.asgi"], env)
    assert web.returncode != 0 and "Set DJANGO_SECRET_KEY" in web.stderr
    celery = [sys.executable, "-m", "celery", "-A", "config.celery_app"]
    for command in (
        ["worker", "--pool", "solo", "-Q", "billing"],
        ["beat", "-s", str(tmp_path / "schedule")],
    ):
        done = run([*celery[1:], *command], env)
        assert done.returncode != 0 and "Set DJANGO_SECRET_KEY" in done.stderr, command


def test_a_gpuworker_refuses_redis_without_credentials_outside_local_mode():
    env = {k: v for k, v in PRODUCTION.items() if not k.startswith("REDIS_PASSWORD")}
    done = run(["manage.py", "gpuworker", "--model", "m"], env)
    assert done.returncode != 0 and "Redis needs ACL credentials" in done.stderr


def test_seed_demo_refuses_outside_local_mode():
    done = run(["manage.py", "seed_demo"], PRODUCTION)
    assert done.returncode != 0 and "local mode only" in done.stderr


def test_local_mode_is_friendly_but_only_when_asked():
    shown = settings_under(
        {"DJANGO_ENV": "local", "DJANGO_SECRET_KEY": "local", "REDIS_URL": "redis://127.0.0.1/0"}
    )
    assert shown["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]"]
    assert not shown["SESSION_COOKIE_SECURE"] and not shown["SECURE_SSL_REDIRECT"]
    assert shown["SECURE_HSTS_SECONDS"] == 0
    # DEBUG is never implied by local mode: bin/run turns it on itself.
    assert shown["DEBUG"] is False


def test_the_admin_lives_at_the_configured_path():
    shown = settings_under({**PRODUCTION, "DJANGO_ADMIN_URL": "/ops-7f3a/"})
    assert shown["ADMIN_URL"] == "ops-7f3a/"


@pytest.mark.parametrize("module", ["config.settings.production", "config.settings.local"])
def test_each_module_can_be_named_directly_whatever_django_env_says(module):
    """An explicit DJANGO_SETTINGS_MODULE wins over DJANGO_ENV (cookiecutter's way)."""
    env = {**PRODUCTION, "DJANGO_ENV": "local" if module.endswith("production") else "production"}
    shown = settings_under(env, module)
    production = module.endswith("production")
    assert shown["SESSION_COOKIE_SECURE"] is production
    assert (shown["SECURE_HSTS_SECONDS"] >= 31_536_000) is production


def test_the_test_run_uses_the_test_module_on_top_of_local_mode(settings):
    assert settings.SETTINGS_MODULE == "config.settings.test"
    assert settings.LOCAL and not settings.SESSION_COOKIE_SECURE
    assert settings.PASSWORD_HASHERS == ["django.contrib.auth.hashers.MD5PasswordHasher"]
