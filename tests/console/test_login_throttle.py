"""Login throttling (django-axes): a locked username and address pair gets 429."""

import pytest

pytestmark = pytest.mark.django_db

PASSWORD = "right-password-1"


def attempt(client, username, password, ip="10.0.0.1"):
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def test_five_failures_lock_the_pair_even_for_the_right_password(client, user_factory, settings):
    user_factory(username="target", password=PASSWORD)
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "target", "guess").status_code == 200
    # The failure that reaches the limit is itself answered with the lockout.
    assert attempt(client, "target", "guess").status_code == 429
    locked = attempt(client, "target", PASSWORD)
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another address is not locked out by the attacker's.
    assert attempt(client, "target", PASSWORD, ip="10.0.0.2").status_code == 302


def test_unknown_usernames_lock_the_same_way(client, settings):
    """Locking only real accounts would tell which usernames exist."""
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "no-such-user", "guess")
    assert attempt(client, "no-such-user", "guess").status_code == 429
