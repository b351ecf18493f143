from django.apps import AppConfig


class GpuworkersConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "gpuworkers"
