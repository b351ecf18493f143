"""GPU time accounting: per-worker samples of busy and idle seconds."""

from django.db import models


class WorkerMeter(models.Model):
    """The last cumulative counters sampled from one worker process.

    Workers report counters that only grow while the process lives; a
    sample records the difference to this row. ``boot_id`` changes when a
    worker restarts (its counters start again at 0), so a restart starts a
    new meter instead of producing a negative delta.
    """

    worker_id = models.CharField(max_length=128)
    boot_id = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    busy_seconds = models.FloatField(default=0.0)
    idle_seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker_id", "boot_id"], name="worker_meter_unique")
        ]

    def __str__(self) -> str:
        return f"{self.worker_id} ({self.boot_id})"


class GpuUsageSample(models.Model):
    """Busy and idle seconds of one worker over one sampling interval.

    Keyed by the counters it ends at, so sampling the same heartbeat twice
    (a retried task, two beats racing) cannot count the same seconds twice.
    """

    worker_id = models.CharField(max_length=128)
    boot_id = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    model_version = models.CharField(max_length=64, blank=True)
    day = models.DateField()
    sampled_at = models.DateTimeField()
    busy_seconds = models.FloatField()
    idle_seconds = models.FloatField()
    # The counters at the end of the interval.
    busy_total = models.FloatField()
    idle_total = models.FloatField()
    hourly_price = models.DecimalField(max_digits=20, decimal_places=10)

    class Meta:
        ordering = ["-sampled_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["worker_id", "boot_id", "busy_total", "idle_total"],
                name="gpu_sample_unique",
            )
        ]
        indexes = [models.Index(fields=["day", "model"], name="gpu_sample_day_model_idx")]

    def __str__(self) -> str:
        return f"{self.worker_id} {self.sampled_at:%Y-%m-%d %H:%M}"
