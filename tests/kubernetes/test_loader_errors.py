"""Malformed dumps: one InputError naming the file and the JSON path (exit 2 from the CLI), never a traceback.

The property: take a valid recorded dump, replace any one value anywhere with a value of another shape; loading
either succeeds or raises InputError whose source is the file and whose path leads into the document."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.engines.kubernetes import load_dump
from gpudefrag.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures"
DOC = json.loads((FIXTURES / "fragmentation.json").read_text())


def _paths(v: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*prefix, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, (*prefix, i))
    return out


# skip the managedFields and the long tails that nothing reads, so most examples hit fields that matter
PATHS = [p for p in _paths(DOC) if "managedFields" not in p and "fieldsV1" not in p]
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                            st.integers(), max_size=2))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


_STEP = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\["([^"]*)"\]')  # [""]: the empty key


def _resolves(doc: Any, where: str) -> bool:
    """The error's path leads into the document (its parent exists; the last step may be the missing field)."""
    steps = []
    pos = 0
    while pos < len(where):
        m = _STEP.match(where, pos)
        if not m:
            return False
        steps.append(m.group(1) if m.group(1) is not None else int(m.group(2)) if m.group(2) else m.group(3))
        pos = m.end()
    cur = doc
    for s in steps[:-1]:
        try:
            cur = cur[s]
        except (KeyError, IndexError, TypeError):
            return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(idx=st.integers(0, len(PATHS) - 1), value=JUNK)
def test_any_corruption_gives_one_named_error_or_loads(idx: int, value: Any) -> None:
    doc = json.loads(json.dumps(DOC))
    path = PATHS[idx]
    _set(doc, path, value)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "dump.json"
        f.write_text(json.dumps(doc))
        try:
            load_dump(f)
        except InputError as e:
            assert e.source == str(f)
            assert e.where and _resolves(doc, e.where), (e.where, path)


@pytest.mark.parametrize(("mutate", "where", "words"), [
    (lambda d: d["items"][3]["status"]["allocatable"].__setitem__("nvidia.com/gpu", "lots"),
     'items[3].status.allocatable["nvidia.com/gpu"]', "expected a quantity"),
    (lambda d: d["items"][4]["spec"].__setitem__("containers", {"name": "x"}), "items[4].spec.containers",
     "expected a list"),
    (lambda d: d["items"][0]["metadata"].pop("name"), "items[0].metadata.name", "required field is missing"),
    (lambda d: d["items"][5]["spec"].__setitem__("nodeName", "gpu-node-99"), "items[5].spec.nodeName",
     "gpu-node-99"),
    (lambda d: d["items"][1]["spec"]["taints"].__setitem__(0, {"key": "a", "effect": "Sometimes"})
     if d["items"][1]["spec"].get("taints") else d["items"][1]["spec"].__setitem__(
         "taints", [{"key": "a", "effect": "Sometimes"}]), "items[1].spec.taints[0].effect", "unknown taint effect"),
    (lambda d: d.pop("kind"), "kind", "not a Kubernetes List"),
    (lambda d: d["items"][0]["status"]["capacity"].__setitem__("nvidia.com/gpu", "1e12"),
     'items[0].status.capacity["nvidia.com/gpu"]', "not plausible"),
    (lambda d: d["items"][1]["metadata"]["labels"].__setitem__("nvidia.com/gpu.count", "99999"),
     'items[1].metadata.labels["nvidia.com/gpu.count"]', "not plausible"),
    # CPU and memory past what the model holds are named at the dump's field, not the model's (nodes[0].cpu_milli:
    # hypothesis found a node's allocatable cpu of 10**12 named so, once)
    (lambda d: d["items"][0]["status"]["allocatable"].__setitem__("cpu", 10**12), "items[0].status.allocatable.cpu",
     "not plausible"),
    (lambda d: d["items"][2]["status"]["allocatable"].__setitem__("memory", "4Ei"),
     "items[2].status.allocatable.memory", "not plausible"),
    (lambda d: d["items"][4]["spec"]["containers"][0]["resources"]["requests"].__setitem__("cpu", "1e12"),
     "items[4].spec.containers[0].resources.requests.cpu", "not plausible"),
    (lambda d: d["items"][4]["spec"].__setitem__("containers", [
        {"name": f"c{i}", "resources": {"requests": {"cpu": 6 * 10**8}}} for i in range(2)]),
     "items[4].spec.containers", "add up to"),
])
def test_specific_errors_name_the_path(tmp_path: Path, mutate: Any, where: str, words: str) -> None:
    doc = json.loads(json.dumps(DOC))
    mutate(doc)
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError) as ei:
        load_dump(f)
    assert ei.value.where == where and words in ei.value.message


def test_bad_json_names_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "dump.json"
    f.write_text('{"apiVersion": "v1", "items": [\n  {"kind": "Node",, }\n]}')
    with pytest.raises(InputError) as ei:
        load_dump(f)
    assert ei.value.where.startswith("line 2")


def test_folder_error_names_the_file_inside(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(DOC))
    (tmp_path / "b.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [{"kind": 3}]}))
    with pytest.raises(InputError) as ei:
        load_dump(tmp_path)
    assert ei.value.source == str(tmp_path / "b.json") and ei.value.where == "items[0].kind"


def test_dump_without_nodes_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "pods.json"
    f.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                             "items": [i for i in DOC["items"] if i["kind"] == "Pod"]}))
    with pytest.raises(InputError, match="no Node objects"):
        load_dump(f)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
                        ["kind", "items", "apiVersion", "metadata", "spec", "status", "name", "x"]), c, max_size=4),
                    max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(doc=JSON, as_folder=st.booleans())
def test_arbitrary_documents_give_one_named_error(doc: Any, as_folder: bool) -> None:
    """Any JSON at all, as a file or as one file of a folder beside a valid dump: never a traceback."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        f = root / "b.json"
        f.write_text(json.dumps(doc))
        if as_folder:
            (root / "a.json").write_text(json.dumps(DOC))
        try:
            load_dump(root if as_folder else f)
        except InputError as e:
            assert e.source in (str(f), str(root))
            assert e.where
