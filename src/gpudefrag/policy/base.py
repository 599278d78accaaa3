"""What every part of the policy file shares: the strict model base (an unknown key is a typo and an error,
never a silently ignored setting) and the cron expression check (valid, and fires at least once)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PosSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def cron_expression(v: str | None) -> str | None:
    """A cron expression (five fields) that can fire: a valid one that never does ('0 0 30 2 *') would fail
    every later evaluation."""
    if v is None:
        return None
    if not croniter.is_valid(v):
        raise ValueError(f"not a cron expression: {v!r} (five fields, e.g. '*/15 * * * *')")
    try:
        croniter(v, datetime(2000, 1, 1)).get_next(float)  # a leap year: '29 2' fires
    except (ValueError, KeyError) as e:
        raise ValueError(f"cron expression {v!r} never fires") from e
    return v
