"""Load a policy file (YAML or JSON) into a validated Policy; any problem is one InputError naming the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import InputError, loc_to_path
from .models import Policy


def parse_policy(doc: Any, source: str = "<policy>") -> Policy:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError(source, "(document)", f"a policy is a mapping, got {type(doc).__name__}")
    try:
        return Policy.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        return_loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        raise InputError(source, loc_to_path(return_loc), msg) from None


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and validate a policy file. Raises InputError(file, field, message)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(str(p), "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(str(p), "", "not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(str(p), where, f"not valid YAML: {getattr(e, 'problem', None) or e}") from None
    return parse_policy(doc, str(p))
