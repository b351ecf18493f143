from django.urls import path

from console import batch_views, safety_views, team_views, views

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
    path(
        "team/invitations/<int:invitation_id>/revoke/",
        team_views.invitation_revoke_view,
        name="invitation_revoke",
    ),
    path("invitations/<str:token>/", team_views.invitation_accept_view, name="invitation_accept"),
    path("audit/", team_views.audit, name="audit"),
    path("safety/", safety_views.safety, name="safety"),
    path("batches/", batch_views.batches, name="batches"),
    path("batches/progress.json", batch_views.batches_progress, name="batches_progress"),
    path("batches/<str:batch_id>/cancel/", batch_views.batch_cancel_view, name="batch_cancel"),
    path("batches/<str:batch_id>/<str:kind>/", batch_views.batch_file, name="batch_file"),
    path("team/shadow/", team_views.shadow_consent, name="shadow_consent"),
    path("fleet/", views.fleet, name="fleet"),
    path("fleet/capacity/", views.capacity_view, name="capacity"),
]
