"""Fast typed JSON decoding for the formats whose single definition is a pydantic model.

A 10,000-node snapshot is 18 MB; pydantic's validator plus the guarded `json` parse that finds duplicate keys
took 2.5-2.8 x a bare `json.loads` of the file. msgspec decodes straight into typed structs at a fraction of
that, but its messages and its duplicate-key handling (the last one wins, silently) are not ours. So this
module *derives* a msgspec mirror from the pydantic model (the same fields, types, bounds and defaults; a type
it cannot mirror exactly is an error at import, never a looser check) and the readers use it as a fast path:

- `decode(raw, mirror)` returns the typed value, or None when msgspec refuses the bytes (malformed JSON, a
  wrong type, a bound, an unknown or missing field) or the document repeats a key. The caller then reads the
  file the careful way (the guarded parse and pydantic), which names the file, the field and the problem exactly
  as before. Refusals are rare and cost only the careful read they always cost; accepted documents never see it.

- a field the document leaves out is `ABSENT` in the mirror's value (so that the repeated-key count sees
  only the keys the file gave); `reader(model)` reads an object's fields with the model's defaults in its place.

- a field marked `Annotated[T, REPEATED]` (a value most objects of a file share, such as a workload's versions)
  is left undecoded in the mirror (`msgspec.Raw`, the bytes as the file spells them); the caller decodes and
  checks each distinct spelling once (`REPEATED.decoder`) and shares what it made of it between its repeats.

The mirror accepts exactly what the pydantic model accepts; the property tests compare the two on corrupted
documents (tests/core/test_snapshot.py).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from . import fileio

_SCALARS = (int, float, str, bool)


def _meta(metadata: list[Any], where: str) -> dict[str, Any]:
    """The msgspec.Meta keywords for pydantic's constraint metadata; unknown constraints refuse the mirror."""
    out: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, FieldInfo):
            out.update(_meta(m.metadata, where))
        elif isinstance(m, at.Ge):
            out["ge"] = m.ge
        elif isinstance(m, at.Le):
            out["le"] = m.le
        elif isinstance(m, at.Gt):
            out["gt"] = m.gt
        elif isinstance(m, at.Lt):
            out["lt"] = m.lt
        elif isinstance(m, at.MinLen):
            out["min_length"] = m.min_length
        elif isinstance(m, at.MaxLen):
            out["max_length"] = m.max_length
        elif type(m).__name__ == "AllowInfNan" and not getattr(m, "allow_inf_nan", True):
            continue  # JSON has no NaN/Infinity literals; an overflowing number must meet a finite bound (below)
        else:
            raise TypeError(f"{where}: no msgspec mirror for the constraint {m!r}")
    return out


def _mirror_type(tp: Any, metadata: list[Any], where: str) -> Any:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        return _mirror_type(base, [*extra, *metadata], where)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if len(args) != 2 or type(None) not in args:
            raise TypeError(f"{where}: no msgspec mirror for {tp!r}")
        inner = next(a for a in args if a is not type(None))
        return _mirror_type(inner, metadata, where) | None  # type: ignore[operator]
    if origin is list:
        # decoded as a tuple: what the readers keep (a placement's GPUs, a node's partitions) is a tuple in the
        # model, and tuple() of a tuple is the tuple itself, where a list would be copied (50,000 of them)
        (item,) = get_args(tp)
        mirrored = tuple[_mirror_type(item, [], where), ...]  # type: ignore[misc]
    elif origin is dict:
        key, value = get_args(tp)
        if key is not str:
            raise TypeError(f"{where}: no msgspec mirror for {tp!r}")
        mirrored = dict[str, _mirror_type(value, [], where)]  # type: ignore[misc]
    elif origin is Literal:
        if any(isinstance(a, bool) for a in get_args(tp)):
            raise TypeError(f"{where}: no msgspec mirror for {tp!r}")
        mirrored = tp
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        mirrored = mirror(tp)
    elif tp in _SCALARS:
        mirrored = tp
    else:
        raise TypeError(f"{where}: no msgspec mirror for {tp!r}")
    kw = _meta(metadata, where)
    if tp is float and not ({"ge", "gt"} & kw.keys() and {"le", "lt"} & kw.keys()):
        # pydantic refuses an overflowing literal (1e999 -> inf) only when allow_inf_nan is off; a two-sided
        # finite bound refuses it in msgspec too. Without one the two could differ: refuse to mirror.
        raise TypeError(f"{where}: a float needs finite bounds on both sides to be mirrored")
    return Annotated[mirrored, msgspec.Meta(**kw)] if kw else mirrored


class Repeated:
    """The marker of a field whose value repeats across the objects of a file (`Annotated[T, REPEATED]`).

    The 50,000 workloads of the benchmark's 10,000-node snapshot carry four distinct sets of versions (a
    cluster has a few dozen at most): decoding each workload's into a struct of strings took 11 ms of the file's
    0.26 s, and the objects were freed unused. The mirror keeps such a field as `msgspec.Raw` (a slice of the
    file, no objects made) and the caller decodes each distinct spelling once, with `T`'s mirror, checking it
    like the rest of the document (repeated keys included, which the whole document's count cannot see inside
    a raw slice). pydantic ignores the marker: the careful path decodes the field as any other."""

    def decoder(self, model: type[BaseModel], name: str) -> Callable[[bytes], Any]:
        """A function from the bytes of a marked field's raw value to its decoded value (`T`'s mirror), which
        raises `Refused` where the careful path must say what is wrong. Its caller keeps what it made of each
        distinct spelling, keyed by those bytes."""
        f = model.model_fields[name]
        if not any(m is self for m in f.metadata):
            raise TypeError(f"{model.__name__}.{name} is not marked REPEATED")
        dec = msgspec.json.Decoder(_mirror_type(f.annotation, [m for m in f.metadata if m is not self],
                                                f"{model.__name__}.{name}"))
        return lambda raw: _checked(dec, raw)


REPEATED = Repeated()


class Refused(ValueError):
    """A part of the document that the mirror refuses (raised where the refusal is found late, by a repeated
    field's decoder): the caller reads the document the careful way, which names the field."""


@cache
def mirror(model: type[BaseModel]) -> type[msgspec.Struct]:
    """The msgspec Struct with `model`'s fields (same names, types, bounds), unknown fields refused. A field the
    document leaves out is `ABSENT` (msgspec.UNSET), not its default: re-encoding the value then writes exactly
    the keys that survived decoding (the repeated-key count, `decode`), and `reader(model)` reads the fields
    with the model's defaults in their place. A field marked `REPEATED` is `msgspec.Raw` (see `Repeated`)."""
    cfg = model.model_config
    if cfg.get("extra") != "forbid" or not cfg.get("strict"):
        raise TypeError(f"{model.__name__}: only strict models that forbid extra fields are mirrored")
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name, f in model.model_fields.items():
        if f.alias not in (None, name) or f.validation_alias not in (None, name):
            raise TypeError(f"{model.__name__}.{name}: aliases are not mirrored")
        if any(m is REPEATED for m in f.metadata):
            tp: Any = msgspec.Raw
        else:
            tp = _mirror_type(f.annotation, list(f.metadata), f"{model.__name__}.{name}")
        fields.append((name, tp) if f.is_required() else (name, tp | msgspec.UnsetType, ABSENT))
    # gc=False: the cyclic collector need not track them (decoded JSON holds no cycles), so the 100,000s of a
    # large snapshot cost less to make and to free
    return msgspec.defstruct(f"{model.__name__}Fast", fields, kw_only=True, forbid_unknown_fields=True,
                             frozen=True, gc=False)


ABSENT = msgspec.UNSET  # a field the document leaves out, in a mirror's value


@cache
def reader(model: type[BaseModel]) -> Callable[[Any], tuple[Any, ...]]:
    """A function from an object with `model`'s fields (the model itself, or its mirror) to the tuple of their
    values in the model's order, each `ABSENT` one replaced by the model's default (a default factory's value
    is made once and shared: callers copy what they keep). Generated, so that 50,000 workloads read at the
    speed of plain attribute access."""
    scope: dict[str, Any] = {"ABSENT": ABSENT}
    lines = []
    names = []
    for i, (name, f) in enumerate(model.model_fields.items()):
        names.append(f"v{i}")
        lines.append(f"    v{i} = o.{name}")
        if not f.is_required():
            scope[f"d{i}"] = f.get_default(call_default_factory=True)
            lines.append(f"    if v{i} is ABSENT:\n        v{i} = d{i}")
    consts = ", ".join(f"{k}={k}" for k in scope)  # bound as parameters' defaults: read as fast locals
    exec(f"def read(o, {consts}):\n" + "\n".join(lines) + f"\n    return ({', '.join(names)},)", scope)
    return scope["read"]  # type: ignore[no-any-return]


@cache
def _decoder(struct: type[msgspec.Struct]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(struct)


def decode(raw: bytes, struct: type[msgspec.Struct]) -> Any | None:
    """The typed value of `raw`, or None when msgspec refuses it (malformed JSON or UTF-8, NaN/Infinity, a wrong
    type, a bound, an unknown or missing field), or the document repeats a key; the caller then takes the careful
    path for the message. Decoded straight to the typed value (an untyped document first, then converted, took
    2.3 x as long). Repeated keys, which msgspec keeps silently, are found by `fileio.lost_a_key`, as for any
    JSON reader; the mirror leaves the fields the file left out `ABSENT`, which re-encoding leaves out too, so the
    count it compares holds. Integers need no digit check here: every integer field of a mirrored model is
    bounded."""
    try:
        return _checked(_decoder(struct), raw)
    except Refused:
        return None


def _checked(dec: msgspec.json.Decoder[Any], raw: bytes) -> Any:
    """`dec`'s value of `raw`, or `Refused` where msgspec refuses the bytes or a repeated key may have been
    dropped: the one fast decode of a whole document (`decode`) and of a repeated field's spelling
    (`Repeated.decoder`). A value may be None (a field spelled `null`), hence an exception, not a None."""
    try:
        value = dec.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # ValidationError (a type, a bound) is a DecodeError
        raise Refused("msgspec refuses the bytes") from None
    if fileio.lost_a_key(raw, value):
        raise Refused("a key may be repeated")
    return value
