"""Settings: see base.py (split into local/production/test next)."""

from config.settings.base import *  # noqa: F403
