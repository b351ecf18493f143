from django.urls import path

from console import views

app_name = "console"

urlpatterns = [
    path("chat/", views.chat, name="chat"),
    path("chat/<int:conversation_id>/", views.chat, name="conversation"),
    path(
        "chat/<int:conversation_id>/delete/",
        views.conversation_delete,
        name="conversation_delete",
    ),
    path("api-keys/", views.api_keys, name="api_keys"),
    path("api-keys/<int:api_key_id>/revoke/", views.api_key_revoke_view, name="api_key_revoke"),
    path("usage/", views.usage, name="usage"),
    path("usage/export.csv", views.usage_csv, name="usage_csv"),
    path("team/", views.team, name="team"),
    path("team/members/<int:membership_id>/role/", views.member_role, name="member_role"),
    path("team/members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path("team/keys/<int:api_key_id>/limits/", views.key_limits, name="key_limits"),
    path("fleet/", views.fleet, name="fleet"),
    path("fleet/capacity/", views.capacity_view, name="capacity"),
]
