"""Policies: trigger + filter + action + budgets + compatibility rule, loaded from YAML (`load_policy`), and the
one PlanOptions builder (`plan_options`) every entry point uses."""

from .loader import load_policy, parse_policy
from .models import Action, Budgets, Compat, Filter, Heartbeat, PendingTrigger, Policy, Trigger, parse_size
from .options import PlanInputs, load_inputs, plan_options

__all__ = ["Action", "Budgets", "Compat", "Filter", "Heartbeat", "PendingTrigger", "PlanInputs", "Policy", "Trigger",
           "load_inputs", "load_policy", "parse_policy", "parse_size", "plan_options"]
