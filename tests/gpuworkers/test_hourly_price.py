"""gpuworker --hourly-price: validated, defaulted from settings, reported in the heartbeat."""

import pytest
from django.core.management import CommandError

from gpuworkers.engine.config import EngineConfig
from gpuworkers.management.commands.gpuworker import Command
from gpuworkers.worker import WorkerLoop


@pytest.mark.parametrize("price", ["abc", "-1", "NaN"])
def test_an_invalid_hourly_price_is_refused(price):
    with pytest.raises(CommandError, match="--hourly-price must be a non-negative number"):
        Command()._hourly_price({"hourly_price": price})


def test_the_hourly_price_defaults_to_the_setting(settings):
    settings.WORKER_HOURLY_PRICE = "3.10"
    assert Command()._hourly_price({"hourly_price": None}) == "3.10"
    assert Command()._hourly_price({"hourly_price": "0.5"}) == "0.5"


def test_the_heartbeat_carries_price_boot_id_and_counters():
    class Engine:
        max_model_len = 128
        config = EngineConfig()

        def stats(self):
            return {}

    loop = WorkerLoop(Engine(), bus=None, worker_id="w", model_name="m", hourly_price="2.75")
    loop._refresh_stats(force=True)
    extra = loop.info().extra
    assert extra["hourly_price"] == "2.75" and len(extra["boot_id"]) == 32
    assert (extra["busy_seconds"], extra["idle_seconds"]) == (0.0, 0.0)
    other = WorkerLoop(Engine(), bus=None, worker_id="w", model_name="m")
    assert other.info().extra["boot_id"] != extra["boot_id"]
