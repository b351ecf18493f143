from django.urls import path

from billing import views

app_name = "billing"

urlpatterns = [
    path("", views.index, name="index"),
    path("gpu/", views.gpu_report, name="gpu_report"),
    path("gpu.csv", views.gpu_report_csv, name="gpu_report_csv"),
    path("gpu/build/", views.gpu_report_build, name="gpu_report_build"),
    path("runs/<str:task_id>/", views.report_run, name="report_run"),
    path("runs/<str:task_id>/status/", views.report_run_status, name="report_run_status"),
    path("runs/<str:task_id>.csv", views.report_run_csv, name="report_run_csv"),
    path("usage.csv", views.rollup_csv, name="rollup_csv"),
    path("invoices/", views.invoices, name="invoices"),
    path("invoices/<str:number>/", views.invoice_detail, name="invoice"),
    path("invoices/<str:number>.csv", views.invoice_csv, name="invoice_csv"),
]
