"""Typed reads from Kubernetes API JSON that fail with one error naming the file and the JSON path.

A dump is somebody else's document: every field we read is checked for its type here, so a malformed dump gives
`dump.json: items[3].status.allocatable["nvidia.com/gpu"]: expected a quantity, got 'lots'` instead of a
traceback. Paths are built only when an error is raised, so reading a 1,000-node dump stays cheap.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from kubernetes.utils import parse_quantity

from ...errors import InputError
from ...fileio import join_path as join


@lru_cache(maxsize=4096)
def _parse_quantity(v: str) -> Decimal:
    """Quantities repeat across thousands of pods ("8", "64Gi", "100m"): parse each spelling once."""
    return parse_quantity(v)


def _tname(v: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


class At:
    """A value inside a document together with where it came from (file and JSON path).

    The path is kept as a chain of (parent, key) and spelled out only for an error message."""

    __slots__ = ("key", "parent", "source", "value")

    def __init__(self, value: Any, source: str, path: str | At | None = None, key: str | int | None = None) -> None:
        self.value = value
        self.source = source
        self.parent = path
        self.key = key

    @property
    def path(self) -> str:
        keys: list[str | int] = []
        node: At | str | None = self
        while isinstance(node, At):
            if node.key is not None:
                keys.append(node.key)
            node = node.parent
        out = node or ""
        for k in reversed(keys):
            out = join(out, k)
        return out

    def error(self, message: str, key: str | int | None = None) -> InputError:
        return InputError(self.source, join(self.path, key) if key is not None else self.path or "(document)",
                          message)

    # ------------------------------------------------------------------ containers
    def obj(self, key: str, *, required: bool = False) -> At:
        """A nested object (absent/null gives an empty one unless required)."""
        d = self.value
        v = d.get(key) if type(d) is dict else self._get(key, required)
        if v is None and required:
            raise self.error("required field is missing", key)
        if v is None:
            v = {}
        elif type(v) is not dict:
            raise self.error(f"expected an object, got {_tname(v)}", key)
        return At(v, self.source, self, key)

    def items(self, key: str, *, required: bool = False) -> list[At]:
        """The elements of a list (absent/null gives none unless required)."""
        v = self._get(key, required)
        if v is None:
            return []
        if type(v) is not list:
            raise self.error(f"expected a list, got {_tname(v)}", key)
        base = At(v, self.source, self, key)
        src = self.source
        return [At(x, src, base, i) for i, x in enumerate(v)]

    def objects(self, key: str, *, required: bool = False) -> list[At]:
        """Like `items`, each element checked to be an object."""
        out = self.items(key, required=required)
        for a in out:
            if type(a.value) is not dict:
                raise InputError(a.source, a.path, f"expected an object, got {_tname(a.value)}")
        return out

    def _get(self, key: str, required: bool) -> Any:
        if type(self.value) is not dict:
            raise InputError(self.source, self.path or "(document)", f"expected an object, got {_tname(self.value)}")
        v = self.value.get(key)
        if v is None and required:
            raise self.error("required field is missing", key)
        return v

    # ------------------------------------------------------------------ scalars
    def text(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        d = self.value
        if type(d) is not dict:
            return self._get(key, required)  # raises: not an object
        v = d.get(key)
        if v is None:
            if required:
                raise self.error("required field is missing", key)
            return default
        if type(v) is not str:
            raise self.error(f"expected a string, got {_tname(v)}", key)
        return v

    def req_str(self, key: str) -> str:
        v = self.text(key, required=True)
        assert v is not None
        if not v:
            raise self.error("must not be empty", key)
        return v

    def integer(self, key: str, default: int | None = None) -> int | None:
        v = self._get(key, False)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"expected an integer, got {_tname(v)}", key)
        return v

    def flag(self, key: str, default: bool = False) -> bool:
        v = self._get(key, False)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(f"expected a boolean, got {_tname(v)}", key)
        return v

    def str_map(self, key: str) -> dict[str, str]:
        """A map of strings to strings (labels, annotations, nodeSelector)."""
        m = self.obj(key).value
        for k, v in m.items():
            if type(v) is not str:
                raise InputError(self.source, join(join(self.path, key), k), f"expected a string, got {_tname(v)}")
        return m

    def quantity(self, key: str) -> Decimal | None:
        """A resource quantity (`16Gi`, `500m`, `8`); numbers are accepted as kubectl does."""
        v = self._get(key, False)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise self.error(f"expected a quantity, got {_tname(v)}", key)
        try:
            q = _parse_quantity(v) if type(v) is str else parse_quantity(v)
        except (ValueError, InvalidOperation, TypeError):
            raise self.error(f"expected a quantity (e.g. 8, 500m, 16Gi), got {v!r}", key) from None
        if not q.is_finite() or q < 0:
            raise self.error(f"expected a non-negative quantity, got {v!r}", key)
        if q >= 2**63:  # the model's fields are int64 at most (and its own bounds are stricter)
            raise self.error(f"quantity {str(v)[:24]!r} is out of range (at most 2**63-1)", key)
        return q

    def count(self, key: str) -> int | None:
        """A quantity that must be a whole number (GPUs, MIG slices)."""
        q = self.quantity(key)
        if q is None:
            return None
        if q != q.to_integral_value():
            raise self.error(f"expected a whole number, got {self.value[key]!r}", key)
        return int(q)

    def time(self, key: str) -> float | None:
        """An RFC 3339 timestamp as seconds since the epoch."""
        v = self.text(key)
        if not v:
            return None
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise self.error(f"expected an RFC 3339 time, got {v!r}", key) from None
