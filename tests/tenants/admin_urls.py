"""Admin-only URLconf, so the admin tests do not depend on the API routes."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
