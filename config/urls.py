from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from config import views
from config.api import api
from inference.views import home

urlpatterns = [
    path("", home, name="home"),
    # Browsers ask for /favicon.ico on pages that name none (the admin's).
    path("favicon.ico", RedirectView.as_view(url=static("console/favicon.svg"), permanent=True)),
    # Operators: Prometheus metrics (behind METRICS_TOKEN), liveness, readiness.
    path("metrics", views.metrics, name="prometheus-django-metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    # DJANGO_ADMIN_URL: a path of the operator's choosing, not the well-known one.
    path(settings.ADMIN_URL, admin.site.urls),
    path("v1/", api.urls),
    path("fleet/", include("fleet.urls")),
    path("billing/", include("billing.urls")),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("console.urls")),
]
