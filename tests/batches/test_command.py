"""``manage.py batches``: list and cancel for operators."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from batches.models import Batch
from tests.batches.test_execution import new_batch

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("demo_model", "batch_files")]


def test_list_and_cancel(api_key_factory, capsys):
    key, _ = api_key_factory(tier="pro")
    batch = new_batch(key, 2)
    call_command("batches", "list", "--tenant", key.tenant.slug)
    out = capsys.readouterr().out
    assert batch.pk in out and "in_progress" in out and "0+0/2" in out
    call_command("batches", "cancel", batch.pk)
    assert capsys.readouterr().out.strip() == f"{batch.pk} cancelling"
    assert Batch.objects.get(pk=batch.pk).status == "cancelling"
    with pytest.raises(CommandError, match="No batch"):
        call_command("batches", "cancel", "batch_missing")
    with pytest.raises(CommandError, match="No tenant"):
        call_command("batches", "list", "--tenant", "nobody")
