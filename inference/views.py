"""The landing page: what is served here and where to go next."""

from django.shortcuts import render

from inference.models import ServedModel


def home(request):
    models = ServedModel.objects.filter(is_active=True).prefetch_related("tiers").order_by("name")
    return render(request, "home.html", {"models": models})
