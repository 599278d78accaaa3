"""Policies: trigger + filter + action + budgets, loaded from YAML (`load_policy`)."""

from .loader import load_policy, parse_policy
from .models import Action, Budgets, Filter, Heartbeat, PendingTrigger, Policy, Trigger, parse_size

__all__ = ["Action", "Budgets", "Filter", "Heartbeat", "PendingTrigger", "Policy", "Trigger", "load_policy",
           "parse_policy", "parse_size"]
