"""Billing models: usage, prices, roll-ups, invoices, budgets, GPU accounting."""

from billing.models.budgets import BudgetAlert, BudgetPolicy
from billing.models.gpu import GpuUsageSample, WorkerMeter
from billing.models.invoices import Invoice, InvoiceLine
from billing.models.pricing import Price
from billing.models.rollups import DailyUsage
from billing.models.usage import UsageDeadLetter, UsageRecord

__all__ = [
    "BudgetAlert",
    "BudgetPolicy",
    "DailyUsage",
    "GpuUsageSample",
    "Invoice",
    "InvoiceLine",
    "Price",
    "UsageDeadLetter",
    "UsageRecord",
    "WorkerMeter",
]
