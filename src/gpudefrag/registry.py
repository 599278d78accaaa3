"""One small registry, the descheduler's plugin shape: a name maps to one function and the typed arguments it
takes (a strict pydantic model), kept in the order the entries were registered.

The checkpoint backends (`checkpoint.registry`), the engines (`engines.registry`), the diagnosis's cause checks
(`core.diagnose`) and the controller's triggers (`policy.triggers`) are each one `Registry`: registering,
listing, validating arguments and refusing an unknown name or argument are written here once. Arguments are
checked against the entry's model before its function runs, so a typo or a wrong type is an error that names the
entry and the field, never a silently ignored setting or a crash halfway through building.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

F = TypeVar("F", bound=Callable[..., Any])


class NoArgs(BaseModel):
    """The arguments of an entry that takes none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Args(BaseModel):
    """Base of an entry's argument model: strict (an unknown argument is an error), any Python type allowed
    (`InstanceOf[...]` for objects a builder is handed, such as a cluster state)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered name: its function and the model its arguments must satisfy."""

    name: str
    fn: F
    args: type[BaseModel]


class Registry(Generic[F]):
    """Entries of one kind (`what`: "engine", "checkpoint backend", ...), in registration order.

    `error` builds the exception an unknown name or a bad argument raises (a ValueError unless the kind has its
    own, as checkpoint backends do); its message names the kind, the entry and every bad field."""

    def __init__(self, what: str, error: Callable[[str], Exception] = ValueError) -> None:
        self.what = what
        self._error = error
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, args: type[BaseModel] = NoArgs) -> Callable[[F], F]:
        """Decorator: register the function under `name`, after those already registered, with its arguments'
        model. A name registered twice is a programming error."""

        def add(fn: F) -> F:
            if name in self._entries:
                raise RuntimeError(f"{self.what} {name!r} registered twice")
            self._entries[name] = Entry(name, fn, args)
            return fn

        return add

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __iter__(self) -> Iterator[Entry[F]]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def entry(self, name: str) -> Entry[F]:
        """The entry registered as `name`; an unknown name is an error listing the known ones."""
        if name not in self._entries:
            raise self._error(f"unknown {self.what} {name!r}; known: {', '.join(self._entries)}")
        return self._entries[name]

    def args(self, name: str, **kwargs: Any) -> dict[str, Any]:
        """The arguments for `name`, validated against its model, as the model converted them (a path string
        becomes a Path): only those given and not None (None is "not given"), so a function's own defaults stay
        its own and are not restated here. An unknown argument or a wrong type is an error naming the entry and
        the field."""
        e = self.entry(name)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}  # None: not given
        allowed = set(e.args.model_fields)
        bad = sorted(set(kwargs) - allowed)
        if bad:
            raise self._error(f"{self.what} {name!r} takes no argument(s) {', '.join(bad)}; "
                              f"it takes {sorted(allowed)}")
        try:
            model = e.args.model_validate(kwargs)
        except ValidationError as err:
            fields = "; ".join(f"{'.'.join(str(p) for p in x['loc'])}: {x['msg']}" for x in err.errors())
            raise self._error(f"{self.what} {name!r}: {fields}") from None
        return {k: getattr(model, k) for k in kwargs}

    def build(self, name: str, **kwargs: Any) -> Any:
        """Call the function registered as `name` with its validated arguments."""
        return self.entry(name).fn(**self.args(name, **kwargs))
