"""The landing page: what is served here and where to go next."""

from django.shortcuts import render

from fleet.selectors import served_model_list_active


def home(request):
    return render(request, "home.html", {"models": served_model_list_active()})
