"""Load a policy file (YAML or JSON) into a validated Policy; any problem is one InputError naming the field."""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError

from .. import fileio
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
    """Read (guarded: regular file, size, depth, duplicates, numbers) and validate a policy file: JSON when it
    is named .json, else YAML. Raises InputError(file, field, message)."""
    src = str(path)
    raw = fileio.read_input(path, "policy")
    return parse_policy(fileio.parse_json(raw, src) if src.lower().endswith(".json") else fileio.parse_yaml(raw, src),
                        src)
