"""The served-model catalog: which models exist and which tiers may use them."""

from django.db import models


class ServedModel(models.Model):
    """A model the platform serves under ``name`` (the OpenAI ``model`` field).

    ``path`` is a Hugging Face directory on the web and worker hosts; blank
    means the demo model directory, resolved at run time so the catalog row
    does not pin a host-specific cache path.
    """

    name = models.CharField(max_length=128, unique=True)
    path = models.CharField(max_length=512, blank=True)
    context_length = models.PositiveIntegerField(
        help_text="Longest prompt + completion the model itself supports."
    )
    tiers = models.ManyToManyField(
        "tenants.Tier",
        related_name="served_models",
        blank=True,
        help_text="Tiers whose keys may call this model; others get 404 model_not_found.",
    )
    is_active = models.BooleanField(default=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
