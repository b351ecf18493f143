"""Joining a tenant by invitation, end to end in Chromium.

A tenant admin invites an address from the team page; the email (Django's
file backend, read from disk) carries the link; a signed-out browser opens
it, is refused a weak password, creates the account and lands in the chat
as a member; the link then no longer works.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from tests.browser.conftest import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db]

STRONG = "violet-Harbour-42-kite"


@pytest.fixture(scope="module", autouse=True)
def mailbox(tmp_path_factory):
    """The servers of this module write emails to files here (they inherit the env)."""
    path = tmp_path_factory.mktemp("mail")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
        patch.setenv("EMAIL_FILE_PATH", str(path))
        yield path


def invitation_link(mailbox: Path, email: str) -> str:
    for message in sorted(mailbox.iterdir()):
        text = message.read_text()
        if f"To: {email}" in text:
            return re.search(r"https?://\S+/invitations/\S+/", text).group(0)
    raise AssertionError(f"no email to {email} in {mailbox}")


def page_in_new_context(chromium, console_site):
    context = chromium.new_context(base_url=console_site.base_url)
    context.set_default_timeout(30_000)
    return context, context.new_page()


def test_an_invited_person_joins_with_a_new_account(chromium, console_site, mailbox):
    email = f"invitee-{uuid.uuid4().hex[:6]}@example.com"
    username = f"invitee-{uuid.uuid4().hex[:6]}"
    admin_context, admin = page_in_new_context(chromium, console_site)
    admin.goto("/accounts/login/")
    admin.fill('input[name="username"]', console_site.username)
    admin.fill('input[name="password"]', console_site.password)
    admin.click('button[type="submit"]')
    admin.wait_for_url("**/chat/")
    admin.click("nav >> text=Team")
    admin.fill('#invite-member input[name="email"]', email)
    admin.select_option('#invite-member select[name="role"]', "member")
    admin.click("text=Send invitation")
    admin.wait_for_selector(f"text=Invitation sent to {email}.")
    assert admin.locator(f'#invitations tr[data-email="{email}"]').count() == 1

    link = invitation_link(mailbox, email)
    assert link.startswith(console_site.base_url)
    guest_context, guest = page_in_new_context(chromium, console_site)
    guest.goto(link)
    assert email in guest.locator("main").inner_text()
    guest.fill('input[name="username"]', username)
    guest.fill('input[name="password1"]', "12345678")
    guest.fill('input[name="password2"]', "12345678")
    guest.click("text=Create account")
    assert "too common" in guest.content() or "entirely numeric" in guest.content()
    guest.fill('input[name="password1"]', STRONG)
    guest.fill('input[name="password2"]', STRONG)
    guest.click("text=Create account")
    guest.wait_for_url("**/chat/")
    assert guest.locator(".who .user").inner_text() == username
    # A member: no team page, and no key to create.
    assert guest.locator("nav >> text=Team").count() == 0
    guest.click("nav >> text=API keys")
    assert guest.locator("#create-key").count() == 0
    screenshot(guest, "invitation-joined")

    # Single use: the same link, signed out, is refused.
    guest_context.clear_cookies()
    guest.goto(link)
    assert "This invitation cannot be used" in guest.content()

    admin.goto("/team/")
    assert admin.locator(f'#members tr[data-username="{username}"]').count() == 1
    assert admin.locator(f'#invitations tr[data-email="{email}"]').count() == 0
    guest_context.close()
    admin_context.close()
