"""The snapshot loader: valid files round-trip; every broken file gives one error naming file and field, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.cli.main import run
from gpudefrag.core.model import Request, Versions
from gpudefrag.demo import demo_document, demo_state
from gpudefrag.errors import InputError
from gpudefrag.snapshot import (
    SCHEMA_PATH,
    Snapshot,
    json_schema,
    load_snapshot,
    read_careful,
    read_fast,
    state_to_dict,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        run(argv)
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def write(tmp_path: Path, doc, name: str = "snap.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def test_shipped_schema_is_current():
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(json.dumps(json_schema(), sort_keys=True))


def test_demo_round_trips(tmp_path):
    s = demo_state()
    p = write(tmp_path, state_to_dict(s))
    s2 = load_snapshot(p)
    assert state_to_dict(s2) == state_to_dict(s)
    assert (s2.free_milli == s.free_milli).all()


def test_yaml_is_accepted(tmp_path):
    import yaml

    p = tmp_path / "snap.yaml"
    p.write_text(yaml.safe_dump(demo_document()))
    assert len(load_snapshot(p).nodes) == 4


def test_validate_command(tmp_path, capsys):
    p = write(tmp_path, demo_document())
    code, out, _ = cli(["snapshot", "validate", str(p), "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"file": str(p), "valid": True, "nodes": 4, "gpus": 32, "running": 9, "pending": 1}


# ------------------------------------------------------------------------------------------ broken input
def _mutations():
    """(description, function doc -> doc, expected field path fragment, expected message fragment)."""
    return [
        ("gpus is a string", lambda d: d["nodes"][1].__setitem__("gpus", "8"), "nodes[1].gpus", "integer"),
        ("negative GPU count", lambda d: d["nodes"][2].__setitem__("gpus", -1), "nodes[2].gpus", "greater than"),
        ("unknown node", lambda d: d["workloads"][3]["placements"][0].__setitem__("node", "ghost"),
         "workloads[3].placements[0].node", "unknown node 'ghost'"),
        ("more GPUs than the node has", lambda d: d["workloads"][0].update(
            gpus_per_node=9, placements=[{"node": "gpu-node-a", "gpus": list(range(9))}]),
         "workloads[0].placements[0].gpus", "asks for 9 GPUs on node 'gpu-node-a', which has 8"),
        ("no room for unassigned GPUs", lambda d: d["workloads"][2].__setitem__("gpus_per_node", 9),
         "workloads[2].placements[0]", "has no room for 9 GPU(s)"),
        ("GPU index out of range", lambda d: d["workloads"][0]["placements"][0].__setitem__("gpus", [0, 1, 9]),
         "workloads[0].placements[0].gpus", "out of range"),
        ("unknown field", lambda d: d["nodes"][0].__setitem__("gpu", 8), "nodes[0].gpu", "unknown field"),
        ("missing field", lambda d: d["nodes"][0].pop("name"), "nodes[0].name", "required"),
        ("bool as int", lambda d: d["nodes"][0].__setitem__("gpus", True), "nodes[0].gpus", "integer"),
        ("version as a float", lambda d: d.__setitem__("version", 1.0), "version", "integer"),
        ("version as a bool", lambda d: d.__setitem__("version", True), "version", "integer"),
        ("duplicate id", lambda d: d["workloads"][1].__setitem__("id", d["workloads"][0]["id"]),
         "workloads[1].id", "duplicate"),
        ("over-allocated GPU", lambda d: d["workloads"][1]["placements"][0].__setitem__("gpus", [0, 1]),
         "workloads[1].placements[0].gpus", "over-allocated"),
        ("bad state", lambda d: d["workloads"][0].__setitem__("state", "sleeping"), "workloads[0].state", "Input"),
    ]


@pytest.mark.parametrize("desc,mutate,where,msg", _mutations(), ids=[m[0] for m in _mutations()])
def test_each_broken_field_is_named(tmp_path, capsys, desc, mutate, where, msg):
    doc = demo_document()
    doc["workloads"][0]["placements"][0]["gpus"] = [0, 1, 2]
    doc["workloads"][1]["placements"][0]["gpus"] = [3, 4]
    mutate(doc)
    p = write(tmp_path, doc)
    with pytest.raises(InputError) as e:
        load_snapshot(p)
    assert e.value.source == str(p)
    assert e.value.where.startswith(where), e.value
    assert msg in e.value.message
    code, out, err = cli(["snapshot", "validate", str(p)], capsys)
    assert code == 2 and out == ""
    assert str(p) in err and where in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # one message (Rich may wrap it)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@SETTINGS
@given(data=st.data())
def test_random_corruption_never_crashes(tmp_path, data):
    """Replace any value anywhere with any JSON value: the loader either accepts it or raises InputError."""
    doc = demo_document()
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(JSON_VALUES)
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    p = write(tmp_path, doc)
    try:
        load_snapshot(p)
    except InputError as e:
        assert e.source == str(p) and e.where and e.message


@SETTINGS
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_truncated_json(tmp_path, cut):
    text = json.dumps(demo_document(), indent=1)
    cut = cut % (len(text) - 1)
    p = write(tmp_path, text[:cut])
    with pytest.raises(InputError) as e:
        load_snapshot(p)
    assert e.value.source == str(p)
    assert e.value.where.startswith("line ") or e.value.where == "(document)"


@SETTINGS
@given(pos=st.integers(min_value=0, max_value=10_000), junk=st.binary(min_size=1, max_size=4))
def test_non_utf8(tmp_path, pos, junk):
    raw = json.dumps(demo_document()).encode()
    pos = pos % len(raw)
    bad = raw[:pos] + b"\xff" + junk + raw[pos:]
    p = tmp_path / "snap.json"
    p.write_bytes(bad)
    with pytest.raises(InputError) as e:
        load_snapshot(p)
    assert e.value.source == str(p)
    assert "UTF-8" in e.value.message or "JSON" in e.value.message


@pytest.mark.parametrize("name", ["snap.json", "snap.yaml"])
def test_a_byte_order_mark_before_the_document_is_not_part_of_it(tmp_path, name):
    """Editors on Windows write a UTF-8 BOM first; the snapshot it starts must read as the same cluster."""
    text = json.dumps(demo_document(), indent=1)  # JSON is YAML too
    p = tmp_path / name
    p.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert state_to_dict(load_snapshot(p)) == state_to_dict(demo_state())


@SETTINGS
@given(gpus=st.integers(min_value=-10**6, max_value=-1), idx=st.integers(0, 3))
def test_negative_gpu_counts(tmp_path, gpus, idx):
    doc = demo_document()
    doc["nodes"][idx]["gpus"] = gpus
    with pytest.raises(InputError) as e:
        load_snapshot(write(tmp_path, doc))
    assert e.value.where == f"nodes[{idx}].gpus"


def test_missing_file_and_yaml_errors(tmp_path, capsys):
    code, _, err = cli(["frag", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and "nope.json" in err and "cannot read" in err
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: [\n  - name: a\n    gpus: 8\n  - {")
    with pytest.raises(InputError) as e:
        load_snapshot(p)
    assert e.value.where.startswith("line ")


def test_real_process_exit_code(tmp_path):
    """Through the installed console script: exit 2, one line, no traceback."""
    p = write(tmp_path, "{\"nodes\": [")
    exe = Path(sys.executable).with_name("gpudefrag")
    r = subprocess.run([str(exe), "diagnose", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and str(p) in r.stderr and "line 1" in r.stderr


# ------------------------------------------------------------------------------------ the fast reader
def _outcome(read, raw: bytes):  # type: ignore[no-untyped-def]
    """What a reader makes of `raw`: ("state", document), ("error", message), or ("refused", None) (fast only)."""
    try:
        state = read(raw, "snap.json")
    except InputError as e:
        return "error", (e.where, e.message)
    return ("refused", None) if state is None else ("state", state_to_dict(state))


# the bounds of the format's fields, either side: where a mirror that lost a constraint would differ
_EDGES = [0, 1, 1000, 1001, 1024, 1025, 100_000, 100_001, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**40 + 1,
          2**53, 2**53 + 1, 10**11, 10**11 + 1, 2**63, 2**64]
EDGE_VALUES = (st.sampled_from(_EDGES + [-e for e in _EDGES]) | st.sampled_from([1e11, 1.0, -1e11, 1e11 + 1e-3])
               | st.text(min_size=252, max_size=254) | st.sampled_from(["", "3g.40gb", "nvidia.com/mig-7g.80gb"]))


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_the_fast_reader_accepts_exactly_what_the_careful_one_does(data):
    """The msgspec mirror (typed_json) is a fast path only: a document it accepts reads as the same cluster as
    through pydantic; one the careful reader refuses, it refuses too (or fails with the same message); and it
    refuses nothing the careful reader accepts (that would only be slow, but says the mirror drifted)."""
    doc = demo_document()
    doc["nodes"][0]["mig_devices"] = {"nvidia.com/mig-1g.10gb": 2, "1g.10gb": 1}
    doc["workloads"][2]["mig_profile"] = "mig-1g.10gb"
    # the fields the fast path keeps as the file spells them (typed_json.REPEATED), one spelling on two workloads
    for i in (0, 4):
        doc["workloads"][i]["tolerations"] = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                               "effect": "NoExecute"}]
        doc["workloads"][i]["node_selector"] = {"zone": "a"}
    doc["workloads"][1]["gpu_models"] = ["H100", "A100"]
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(JSON_VALUES | EDGE_VALUES)
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    raw = json.dumps(doc).encode()
    fast, careful = _outcome(read_fast, raw), _outcome(read_careful, raw)
    if fast[0] == "refused":
        assert careful[0] == "error", (path, value, careful)
    else:
        assert fast == careful, (path, value)


@pytest.mark.parametrize(("text", "where"), [
    ('{"nodes": [{"name": "n", "gpus": 1}], "now": 1, "now": 2}', "now"),
    ('{"nodes": [{"name": "n", "gpus": 1, "gpus": 2}]}', "nodes[0].gpus"),
    ('{"nodes": [{"name": "n", "gpus": 1, "labels": {"a": "x", "a": "y"}}]}', "nodes[0].labels.a"),
    # inside a field the mirror keeps raw (typed_json.REPEATED): the whole document's count cannot see it
    ('{"nodes": [{"name": "n", "gpus": 1}], "workloads": [{"id": "a", "gpus_per_node": 1, "placements": '
     '[{"node": "n", "gpus": [0]}], "versions": {"cuda": "12.4", "cuda": "12.6"}}]}', "workloads[0].versions.cuda"),
])
def test_a_repeated_key_is_refused_by_both_readers(text: str, where: str):
    raw = text.encode()
    assert read_fast(raw, "snap.json") is None  # msgspec alone keeps the last one, silently
    with pytest.raises(InputError, match="duplicate key") as e:
        read_careful(raw, "snap.json")
    assert e.value.where == where


def test_a_repeated_key_in_a_large_document_is_refused_on_the_fast_path():
    """Documents past 64 KiB count their ':' with NumPy (fileio._colons), small ones with bytes.count: a repeated
    key deep in a large one is caught the same way, and the same document without it reads fast."""
    nodes = ", ".join(f'{{"name": "n{i}", "gpus": 8, "labels": {{"zone": "a:{i}"}}}}' for i in range(2000))
    good = f'{{"nodes": [{nodes}]}}'.encode()
    bad = good.replace(b'"name": "n1500", "gpus": 8', b'"name": "n1500", "gpus": 8, "gpus": 4')
    assert len(good) > 65536 and bad != good
    state = read_fast(good, "snap.json")
    assert state is not None and len(state.nodes) == 2000
    assert read_fast(bad, "snap.json") is None
    with pytest.raises(InputError, match="duplicate key") as e:
        read_careful(bad, "snap.json")
    assert e.value.where == "nodes[1500].gpus"


def _versions_doc(spellings: list[str]) -> bytes:
    nodes = '{"name": "n", "gpus": 8}'
    ws = ", ".join(f'{{"id": "w{i}", "gpus_per_node": 1, "placements": [{{"node": "n", "gpus": [{i}]}}]'
                   + ("" if v == "absent" else f', "versions": {v}') + "}" for i, v in enumerate(spellings))
    return f'{{"nodes": [{nodes}], "workloads": [{ws}]}}'.encode()


def test_versions_are_decoded_once_per_spelling_and_read_as_the_careful_path_reads_them():
    """The fast path keeps a workload's versions as the file spells them and decodes each distinct spelling
    once (typed_json.REPEATED): repeats share one Versions; other spellings of the same values (spaces, key
    order, a null field, null, left out) read as the careful path reads them."""
    same = '{"gpu_model": "H100", "cuda": "12.4"}'
    raw = _versions_doc([same, same, '{"cuda":"12.4","gpu_model":"H100"}', '{"gpu_model": "H100", "cuda": "12.4", '
                         '"engine": null}', "null", "absent", "{}", same])
    fast = read_fast(raw, "snap.json")
    assert fast is not None
    assert state_to_dict(fast) == state_to_dict(read_careful(raw, "snap.json"))
    ws = fast.workloads
    assert ws[0].versions is ws[1].versions is ws[7].versions
    assert ws[0].versions == ws[2].versions == ws[3].versions
    assert ws[0].versions.gpu_model == "H100" and ws[0].versions.cuda == "12.4"
    assert ws[4].versions == ws[5].versions == ws[6].versions == Versions()


@pytest.mark.parametrize(("bad", "where", "msg"), [
    ('{"gpu_count": -1}', "workloads[2].versions.gpu_count", "greater than or equal to 0"),
    ('{"gpu_count": "8"}', "workloads[2].versions.gpu_count", "valid integer"),
    ('{"cudaa": "12.4"}', "workloads[2].versions.cudaa", "unknown field"),
    ('[]', "workloads[2].versions", "should be an object"),
])
def test_a_bad_versions_value_after_good_repeats_is_named(bad: str, where: str, msg: str):
    """A distinct spelling is checked when it is first met, however many good repeats came before it: the fast
    path refuses the document and the careful one names the field."""
    good = '{"gpu_count": 8}'
    raw = _versions_doc([good, good, bad, good])
    assert read_fast(raw, "snap.json") is None
    with pytest.raises(InputError, match=msg) as e:
        read_careful(raw, "snap.json")
    assert e.value.where == where


def _requests_doc(parts: list[str]) -> bytes:
    nodes = '{"name": "n", "gpus": 16, "gpu_model": "H100"}'
    ws = ", ".join(f'{{"id": "w{i}", "gpus_per_node": 1, "placements": [{{"node": "n", "gpus": [{i}]}}]'
                   + (f", {p}" if p else "") + "}" for i, p in enumerate(parts))
    return f'{{"nodes": [{nodes}], "workloads": [{ws}]}}'.encode()


_TOL = '"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]'


def test_requests_are_shared_per_shape_and_spelling_and_read_as_the_careful_path_reads_them():
    """The fast path keeps a workload's model list, node selector and tolerations as the file spells them and
    shares one Request per shape and spelling (typed_json.REPEATED); the careful path builds each. Both read
    the same cluster, whatever the spelling (spaces, key order, an empty list, left out)."""
    sel = '"node_selector": {"zone": "a", "rack": "r1"}'
    raw = _requests_doc([
        f"{_TOL}, {sel}", f"{_TOL}, {sel}", f"{sel}, {_TOL}", '"node_selector": {"rack": "r1", "zone": "a"}',
        '"gpu_models": ["H100"]', '"gpu_models": ["H100"]', '"tolerations": []', "", _TOL.replace(": ", ":"),
        f'{_TOL}, {sel}, "gpu_milli": 500'])
    fast = read_fast(raw, "snap.json")
    assert fast is not None
    assert state_to_dict(fast) == state_to_dict(read_careful(raw, "snap.json"))
    r = [w.request for w in fast.workloads]
    assert r[0] is r[1] is r[2]  # one shape, one spelling (the fields' order in the workload does not matter)
    assert r[4] is r[5] and r[6] == r[7] and r[8] == Request(1, tolerations=r[0].tolerations)
    assert r[3].node_selector == {"zone": "a", "rack": "r1"} == r[0].node_selector and r[3].tolerations == ()
    assert r[9] is not r[0] and r[9].gpu_milli == 500 and r[9].tolerations == r[0].tolerations
    assert r[0].tolerations[0].key == "node.kubernetes.io/not-ready" and r[4].gpu_models == ("H100",)


@pytest.mark.parametrize(("bad", "where", "msg"), [
    ('"tolerations": [{"key": "k", "effect": "Sometimes"}]', "workloads[2].tolerations[0].effect", "NoSchedule"),
    ('"node_selector": {"zone": 1}', "workloads[2].node_selector.zone", "valid string"),
    ('"node_selector": {"zone": "a", "zone": "b"}', "workloads[2].node_selector.zone", "duplicate key"),
    ('"gpu_models": "H100"', "workloads[2].gpu_models", "valid array"),
    ('"tolerations": [{"keys": "k"}]', "workloads[2].tolerations[0].keys", "unknown field"),
])
def test_a_bad_request_part_after_good_repeats_is_named(bad: str, where: str, msg: str):
    """A distinct spelling of a request's model list, selector or tolerations is checked when first met,
    however many good repeats came before it: the fast path refuses the document, the careful one names it."""
    raw = _requests_doc([_TOL, _TOL, bad, _TOL])
    assert read_fast(raw, "snap.json") is None
    with pytest.raises(InputError, match=msg) as e:
        read_careful(raw, "snap.json")
    assert e.value.where == where


def test_an_escaped_colon_is_read_like_a_plain_one():
    """The duplicate check counts ':' outside and inside strings; a ':' written as \\u003a would miscount, so
    such a document takes the careful path, and reads the same."""
    plain = b'{"nodes": [{"name": "n", "gpus": 1, "labels": {"a": "x:y"}}]}'
    escaped = plain.replace(b"x:y", b"x\\u003ay")
    assert read_fast(escaped, "snap.json") is None
    assert state_to_dict(read_careful(escaped, "snap.json")) == state_to_dict(read_fast(plain, "snap.json"))


def test_defaults_left_out_or_spelled_out_read_alike_on_the_fast_path():
    """The mirror leaves a field the file leaves out ABSENT (for the repeated-key count) and `to_state` reads
    the model's default in its place: a file that spells every default out reads the same, also fast."""
    short = (b'{"nodes": [{"name": "n", "gpus": 2, "taints": [{"key": "k"}]}], "quotas": [{"namespace": "q", '
             b'"gpu_limit": 4}], "node_groups": [{"name": "g", "current": 1, "maximum": 2}], "workloads": [{"id": '
             b'"a", "gpus_per_node": 1, "placements": [{"node": "n"}], "tolerations": [{}], "versions": {}}, '
             b'{"id": "b", "state": "pending", "gpus_per_node": 2}]}')
    full = json.dumps(Snapshot.model_validate_json(short).model_dump(mode="json")).encode()
    assert full.count(b":") > 3 * short.count(b":")
    a, b = read_fast(short, "snap.json"), read_fast(full, "snap.json")
    assert a is not None and b is not None
    assert state_to_dict(a) == state_to_dict(b) == state_to_dict(read_careful(short, "snap.json"))
