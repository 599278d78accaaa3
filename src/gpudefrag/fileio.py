"""File-system primitives every area shares: the one guarded reader for input files, durable atomic JSON writes,
and bulk-loading without GC churn."""

from __future__ import annotations

import codecs
import errno
import gc
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import yaml

from .errors import InputError


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, indent: int | None = 1,
                      sort_keys: bool = False) -> None:
    """Write JSON to a temporary file in the same folder, fsync it, rename it over `path`, fsync the folder:
    a reader never sees half a file, and a crash leaves either the old file or the new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=indent, sort_keys=sort_keys)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextmanager
def bulk_allocation() -> Iterator[None]:
    """Pause the cyclic garbage collector while tens of thousands of acyclic objects are built (a large
    snapshot or Kubernetes dump): the collections they would trigger re-scan the growing heap and double the
    load time. Reference counting still frees everything.

    On the way out the objects made meanwhile are moved to the oldest generation (`gc.freeze()` then
    `gc.unfreeze()`: two list splices), so the first young collection after the pause does not traverse all of
    them at once (0.3 s for a million objects: a third of a 10,000-node snapshot's load); they are looked at by
    the next full collection, as long-lived objects are. (gpudefrag itself never freezes objects for good.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


# ---------------------------------------------------------------------------------------------- guarded reading
# gpudefrag runs as root and reads files other people may have written (snapshots, dumps, policies, traces). Every
# reader takes its bytes from `read_input` and its structure from `parse_json`/`parse_yaml`, so one set of rules
# holds everywhere: only regular files, a size limit, bounded nesting, bounded numbers, no NaN/Infinity, no
# duplicate keys. Each problem is one InputError naming the file and the place.

MAX_BYTES_ENV = "GPUDEFRAG_MAX_INPUT_BYTES"
MiB = 1 << 20
# Generous for the real thing (a 10,000-node snapshot is ~20 MB; the Alibaba pod trace under 1 MB), small
# enough that a mistaken path (a disk image, a log) is refused before it is read into memory.
DEFAULT_MAX_BYTES: dict[str, int] = {
    "snapshot": 1024 * MiB, "dump": 1024 * MiB, "trace": 1024 * MiB, "policy": 4 * MiB, "cost": 4 * MiB,
    "manifest": 16 * MiB, "status": MiB, "token": 4096, "key": 4096,
}
MAX_DEPTH = 100  # containers inside containers; the deepest real document (a Kubernetes object) is ~10
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # what every integer field of the model can hold (int64)
_INT_DIGITS = 19  # len(str(INT_MAX)): longer literals are refused before int() (Python's int-str limit is 4300)

_KIND_NAMES = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def max_input_bytes(kind: str) -> int:
    """The size limit for a file of `kind`: GPUDEFRAG_MAX_INPUT_BYTES when set (for every kind), else the default."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES.get(kind, 64 * MiB)
    if not raw.isdigit() or len(raw) > _INT_DIGITS or int(raw) <= 0:
        raise InputError(MAX_BYTES_ENV, "", f"must be a positive number of bytes, got {raw[:40]!r}")
    return int(raw)


def _require_regular(src: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        what = _KIND_NAMES.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputError(src, "", f"is {what}, not a regular file: refused without reading it", problem="not-regular")


def read_input(path: str | os.PathLike[str], kind: str, *, follow_links: bool = True) -> bytes:
    """The bytes of a regular file, at most max_input_bytes(kind) of them.

    The path is stat()ed first, so a FIFO, a device or a directory (also behind a link) is refused without being
    opened; the open is non-blocking and the descriptor is checked again, so a file swapped in between is refused
    too. `follow_links=False` (for files inside folders gpudefrag manages) refuses a link itself. Paths an
    operator names may be links (a Kubernetes ConfigMap mount is one), but only to a regular file."""
    src = os.fspath(path)
    limit = max_input_bytes(kind)
    try:
        st = os.stat(src, follow_symlinks=follow_links)
    except FileNotFoundError:
        raise InputError(src, "", "cannot read: file not found", problem="missing") from None
    except OSError as e:
        raise InputError(src, "", f"cannot read: {e.strerror or e}", problem="unreadable") from None
    _require_regular(src, st)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(src, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(src, "", "is a symbolic link: refused (give the file itself)", problem="link") from None
        raise InputError(src, "", f"cannot read: {e.strerror or e}", problem="unreadable") from None
    try:
        fst = os.fstat(fd)
        _require_regular(src, fst)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise InputError(src, "", "was replaced while it was being opened: refused", problem="not-regular")
        too_big = InputError(src, "", f"is larger than the {limit:,}-byte limit for a {kind} file "
                             f"(set {MAX_BYTES_ENV} to raise it)", problem="too-large")
        if fst.st_size > limit:
            raise too_big
        chunks: list[bytes] = []
        left = limit + 1
        step = max(8 * MiB, fst.st_size + 1)  # a file that does not grow meanwhile: one read, and no copy to join
        while left > 0:
            try:
                chunk = os.read(fd, min(left, step))
            except OSError as e:
                raise InputError(src, "", f"cannot read: {e.strerror or e}", problem="unreadable") from None
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise too_big
        return b"".join(chunks)
    finally:
        os.close(fd)


def drop_bom(raw: bytes) -> bytes:
    """The bytes after a leading UTF-8 byte-order mark (what spreadsheet tools and some editors write first): it
    is not part of the document, nor of a CSV's first column name."""
    return raw.removeprefix(codecs.BOM_UTF8)


def decode_text(raw: bytes, src: str) -> str:
    """UTF-8 text without a leading byte-order mark, or InputError naming the byte and line of the first bad
    sequence (offsets count from the file's first byte)."""
    skip = len(raw) - len(drop_bom(raw))
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = skip + e.start
        line = raw[:at].count(b"\n") + 1
        raise InputError(src, f"byte {at} (line {line})", "not valid UTF-8") from None


class _Refused(ValueError):
    """Raised from inside the JSON parser's hooks; becomes an InputError with the parser's position."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"duplicate key {dup!r}")
    return d


def _pairs_only(pairs: list[tuple[str, Any]]) -> None:
    _pairs(pairs)


def _constant(name: str) -> float:
    raise _Refused(f"{name} is not a number")


def bounded_int(text: str) -> int:
    """An integer literal that fits in int64 (checked on the digits, before int() builds a huge number)."""
    digits = text.lstrip("+-").replace("_", "")
    v = int(text) if len(digits) <= _INT_DIGITS else None
    if v is None or not INT_MIN <= v <= INT_MAX:
        raise _Refused(f"integer {text[:24]}{'…' if len(text) > 24 else ''} is out of range (at most 2**63-1)")
    return v


def finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Refused(f"number {text[:24]} is out of range (overflows to infinity)")
    return v


_DIGIT_RUNS = bytes(0x39 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))  # digits -> '9', the rest -> ' '
REFUSED = object()  # what fast_json returns where the careful parse must speak


def fast_json(raw: bytes) -> Any:
    """The document in `raw` decoded by msgspec (several times faster than the guarded `json` parse), or
    `REFUSED` where that parse must run to say what is wrong — and only there: the guards hold exactly.
    msgspec refuses malformed JSON and UTF-8, NaN/Infinity, numbers that overflow a double, nesting past the
    recursion limit (as `json` does). Repeated keys, which it keeps silently, are found by `lost_a_key`.
    Integers past int64 are refused by their digits (a run of 19 or more, strings included, sends the document
    to the careful parse, which checks the value)."""
    try:
        doc = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # ValidationError (a number out of range) is a DecodeError
        return REFUSED
    if lost_a_key(raw, doc):
        return REFUSED
    if b"9" * _INT_DIGITS in raw.translate(_DIGIT_RUNS):
        return REFUSED
    return doc


def lost_a_key(raw: bytes, decoded: Any) -> bool:
    """Whether msgspec's value of `raw` may have dropped a repeated key (it keeps the last one silently): every
    key is followed by one ':' outside strings, and a value that lost one re-encodes with fewer ':' than `raw`
    has. True too when `raw` spells a ':' as an escape (the count cannot tell): the caller's careful parse then
    decides. `decoded` must re-encode to exactly the keys the document gave (a typed value leaves out the fields
    the document left out)."""
    # a document with no backslash at all (most) has no escapes: one byte count instead of two 6-byte searches
    escaped = b"\\" in raw and (b"\\u003a" in raw or b"\\u003A" in raw)
    return escaped or _colons(raw) != _colons(msgspec.json.encode(decoded))


def _colons(data: bytes) -> int:
    """How many ':' bytes `data` holds: NumPy's compare-and-count is about four times as fast as `bytes.count`
    on the megabytes of a large snapshot (both passes of `lost_a_key` were a seventh of reading one). It
    compares a slice at a time into one reused mask: a mask the size of the file was a fresh mapping of 18 MB
    whose page faults cost as much as the compare."""
    if len(data) < 65536:
        return data.count(b":")
    a = np.frombuffer(data, dtype=np.uint8)
    mask = np.empty(min(_CHUNK, len(a)), dtype=bool)
    n = 0
    for i in range(0, len(a), _CHUNK):
        part = a[i:i + _CHUNK]
        np.equal(part, _COLON, out=mask[:len(part)])
        n += int(np.count_nonzero(mask[:len(part)]))
    return n


_CHUNK = 1 << 20
_COLON = ord(":")


def parse_json(raw: bytes | str, src: str, *, check_only: bool = False) -> Any:
    """Decode JSON with the guards: duplicate keys, NaN/Infinity, out-of-range numbers and runaway nesting are
    InputErrors with a position. `check_only` applies the structural guards (duplicates, constants, nesting,
    giant literals) and returns None, for callers that parse again with a faster validating parser whose own
    field bounds check the numbers. Bytes go through `fast_json` first; the careful parse below runs only for
    what it refuses, and names the place."""
    if isinstance(raw, bytes) and not check_only:
        doc = fast_json(drop_bom(raw))
        if doc is not REFUSED:
            return doc
    text = decode_text(raw, src) if isinstance(raw, bytes) else raw
    try:
        if check_only:
            json.loads(text, object_pairs_hook=_pairs_only, parse_constant=_constant)
            return None
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=bounded_int,
                          parse_float=finite_float)
    except json.JSONDecodeError as e:
        raise InputError(src, f"line {e.lineno}, column {e.colno}", f"invalid JSON: {e.msg}") from None
    except RecursionError:
        raise InputError(src, "(document)", "invalid JSON: nested too deeply") from None
    except ValueError:  # a hook's refusal, or a literal past Python's int-str digit limit: find where
        where, msg = _locate(text)
        raise InputError(src, where, msg) from None


class _Obj(list):  # type: ignore[type-arg]
    """An object's (key, value) pairs, kept as parsed so that a duplicate can be found."""


class _Num(str):
    """A number literal kept as text: checked after the parse, when its path is known."""


class _Const(str):
    """NaN, Infinity or -Infinity."""


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def join_path(path: str, key: str | int) -> str:
    """`items[3]` + `status` -> `items[3].status`; a key that is not an identifier is quoted: `["nvidia.com/gpu"]`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f'{path}["{key}"]'


def _locate(text: str) -> tuple[str, str]:
    """Parse again, keeping numbers as text, and walk in document order to the first refused value: its path
    and the reason. Runs only after the fast parse refused something, so its cost does not matter."""
    doc = json.loads(text, object_pairs_hook=_Obj, parse_int=_Num, parse_float=_Num, parse_constant=_Const)
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, _Const):
            return path or "(document)", f"{v} is not a number"
        if isinstance(v, _Num):
            try:
                bounded_int(v) if _IDENT_INT.fullmatch(v) else finite_float(v)
            except _Refused as e:
                return path or "(document)", str(e)
        elif isinstance(v, _Obj):
            seen: set[str] = set()
            for k, _ in v:
                if k in seen:
                    return join_path(path, k), "duplicate key (each key may appear once)"
                seen.add(k)
            stack.extend((join_path(path, k), x) for k, x in reversed(v))
        elif isinstance(v, list):
            stack.extend((join_path(path, i), x) for i, x in reversed(list(enumerate(v))))
    return "(document)", "a number is out of range"


_IDENT_INT = re.compile(r"-?[0-9]+")


class _GuardedYamlLoader(yaml.SafeLoader):
    """SafeLoader that composes at most MAX_DEPTH levels and no aliases (an alias bomb expands exponentially when
    the document is walked; real configuration files do not need them)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError(None, None, "anchors and aliases are not accepted", self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                           self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_YAML_INT, _YAML_FLOAT, _YAML_MERGE = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:merge"


def _check_yaml(loader: _GuardedYamlLoader, root: Any, src: str) -> None:
    """Walk the composed node tree (before anything is constructed): duplicate keys, integers past int64 and
    floats that are NaN, infinite or overflow are InputErrors naming the field and its line."""

    def refuse(path: str, node: Any, msg: str) -> InputError:
        m = node.start_mark
        return InputError(src, f"{path or '(document)'} (line {m.line + 1}, column {m.column + 1})", msg)

    stack: list[tuple[str, Any]] = [("", root)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            children: list[tuple[str, Any]] = []
            for key_node, value_node in node.value:
                if key_node.tag == _YAML_MERGE:
                    children.append((path, value_node))
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    raise refuse(path, key_node, "a mapping key must be a plain value")
                key = (key_node.tag, key_node.value)
                child = join_path(path, key_node.value)
                if key in seen:
                    raise refuse(child, key_node, "duplicate key (each key may appear once)")
                seen.add(key)
                children.append((child, value_node))
            stack.extend(reversed(children))  # popped in file order: the first problem in the file is reported
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((join_path(path, i), x) for i, x in reversed(list(enumerate(node.value))))
        elif node.tag == _YAML_INT:
            digits = node.value.lstrip("+-").replace("_", "")
            v = loader.construct_yaml_int(node) if len(digits) <= _INT_DIGITS + 2 else None  # +2: 0x, 0o
            if v is None or not INT_MIN <= v <= INT_MAX:
                raise refuse(path, node, f"integer {node.value[:24]} is out of range (at most 2**63-1)")
        elif node.tag == _YAML_FLOAT and not math.isfinite(loader.construct_yaml_float(node)):
            raise refuse(path, node, f"{node.value[:24]} is not a finite number")


def parse_yaml(raw: bytes | str, src: str) -> Any:
    """Decode YAML (safe types only) with the same guards as parse_json; errors name the field and the line."""
    text = decode_text(raw, src) if isinstance(raw, bytes) else raw
    try:
        loader = _GuardedYamlLoader(text)  # the reader refuses control characters here, before any parsing
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_yaml(loader, node, src)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise InputError(src, where, f"invalid YAML: {e.problem or e}") from None
    except yaml.reader.ReaderError as e:
        raise InputError(src, f"character {e.position}", f"invalid YAML: {e.reason} (#x{e.character:04x})") from None
    except yaml.YAMLError as e:
        raise InputError(src, "(document)", f"invalid YAML: {e}") from None
    except RecursionError:
        raise InputError(src, "(document)", "invalid YAML: nested too deeply") from None


def read_document(path: str | os.PathLike[str], kind: str) -> Any:
    """A guarded read and parse: YAML for .yaml/.yml, JSON otherwise."""
    src = os.fspath(path)
    raw = read_input(path, kind)
    if src.lower().endswith((".yaml", ".yml")):
        return parse_yaml(raw, src)
    return parse_json(raw, src)
