"""Writes for billing: usage records, budgets, roll-ups, invoices, GPU samples."""

from billing.services.budget_alerts import budget_check
from billing.services.budgets import (
    BudgetExhausted,
    BudgetHold,
    BudgetUnavailable,
    budget_release,
    budget_renew,
    budget_reserve,
    budget_settle,
    spend_this_month,
)
from billing.services.gpu import gpu_usage_sample
from billing.services.invoices import invoice_issue, tenants_to_invoice
from billing.services.pricing import price_set
from billing.services.rollups import daily_usage_rollup
from billing.services.settlement import (
    SettleReport,
    claims_settle,
    usage_dead_letter_retry,
    usage_entry_record,
    usage_settle_pending,
)
from billing.services.usage import price_multiplier_for, usage_record_create

__all__ = [
    "BudgetExhausted",
    "BudgetHold",
    "BudgetUnavailable",
    "SettleReport",
    "budget_check",
    "budget_release",
    "budget_renew",
    "budget_reserve",
    "budget_settle",
    "claims_settle",
    "daily_usage_rollup",
    "gpu_usage_sample",
    "invoice_issue",
    "price_set",
    "spend_this_month",
    "tenants_to_invoice",
    "usage_dead_letter_retry",
    "usage_entry_record",
    "price_multiplier_for",
    "usage_record_create",
    "usage_settle_pending",
]
