from django.urls import path

from fleet import views

app_name = "fleet"
urlpatterns = [
    path("signal", views.signal, name="signal"),
    path("state", views.state, name="state"),
]
