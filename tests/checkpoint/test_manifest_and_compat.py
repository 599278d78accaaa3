"""The manifest loader never crashes on bad input (property-based), and the compatibility rule names fields."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.checkpoint import protocol as rc
from gpudefrag.checkpoint.compat import field_names, host_versions, mismatches
from gpudefrag.checkpoint.manifest import CompatRecord, FileEntry, Manifest, parse_manifest, safe_relpath
from gpudefrag.checkpoint.protocol import CheckpointError
from gpudefrag.core.model import Versions

KEY = b"k" * 32
# no per-example deadline: the machine is shared, and a slow example is not a wrong one
PROPS = settings(max_examples=300, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def valid_doc() -> dict:
    m = Manifest(id="wl-1", workload_id="wl", backend="criu", mode="dump", created_at="2026-01-01T00:00:00Z",
                 created_unix=1.0, files=(FileEntry(path="pages-1.img", size=3, sha256="a" * 64),),
                 compat=CompatRecord(cpu_arch="x86_64"), key_id="0" * 16).sign(KEY)
    return json.loads(m.to_json())


def test_round_trip_keeps_the_signature_valid() -> None:
    raw = json.dumps(valid_doc()).encode()
    m = parse_manifest(raw, "m.json")
    assert m.signature_ok(KEY) and not m.signature_ok(b"x" * 32)
    assert m.compat.to_versions() == Versions(cpu_arch="x86_64")


@PROPS
@given(st.binary(max_size=400))
def test_arbitrary_bytes_are_a_bad_manifest_or_parse(raw: bytes) -> None:
    try:
        parse_manifest(raw, "m.json")
    except CheckpointError as e:
        assert e.reason in (rc.BAD_MANIFEST, rc.UNSAFE_PATH)
        assert e.path == "m.json"


@pytest.mark.parametrize("raw", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"created_unix": 1' + b"0" * 5000 + b"}",
    b'{"created_unix": NaN}',
    b'{"created_unix": Infinity}',
])
def test_hostile_nesting_numbers_and_nan_are_a_bad_manifest(raw: bytes) -> None:
    with pytest.raises(CheckpointError) as e:
        parse_manifest(raw, "m.json")
    assert e.value.reason == rc.BAD_MANIFEST and e.value.path == "m.json"
    doc = valid_doc()
    doc["created_unix"] = float("nan")
    with pytest.raises(CheckpointError, match="NaN"):
        parse_manifest(json.dumps(doc).encode(), "m.json")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=8)


@PROPS
@given(st.sampled_from(sorted(valid_doc())), json_values)
def test_a_field_replaced_by_any_json_is_refused_or_still_typed(field: str, value: object) -> None:
    """Swap one field for arbitrary JSON: the loader either refuses naming that field, or yields a typed model."""
    doc = valid_doc()
    doc[field] = value
    try:
        m = parse_manifest(json.dumps(doc).encode(), "m.json")
    except CheckpointError as e:
        assert e.reason in (rc.BAD_MANIFEST, rc.UNSAFE_PATH)
        assert e.detail.startswith(field) or e.reason == rc.UNSAFE_PATH
    else:
        assert isinstance(m.files, tuple) and all(isinstance(f, FileEntry) for f in m.files)


def test_unknown_fields_and_wrong_types_name_the_field() -> None:
    doc = valid_doc()
    doc["extra"] = 1
    with pytest.raises(CheckpointError, match="extra"):
        parse_manifest(json.dumps(doc).encode(), "m.json")
    doc = valid_doc()
    doc["files"][0]["size"] = "3"
    with pytest.raises(CheckpointError, match=r"files\[0\]\.size"):
        parse_manifest(json.dumps(doc).encode(), "m.json")


@pytest.mark.parametrize(("path", "ok"), [("pages-1.img", True), ("a/b.img", True), ("../x", False),
                                          ("/etc/passwd", False), ("a//b", False), ("a/../../b", False),
                                          ("manifest.json", False), (".", False)])
def test_safe_relpath(path: str, ok: bool) -> None:
    assert safe_relpath(path) is ok


def test_mismatches_name_each_field() -> None:
    rec = Versions(gpu_model="H100", gpu_count=8, driver="550.54", cuda="12.4", cpu_arch="x86_64",
                   kernel="6.18", checkpointer="criu 4.1.1", engine="pytorch 2.13", model="m@1")
    here = Versions(gpu_model="A100", gpu_count=4, driver="550.54", cuda="12.4", cpu_arch="x86_64",
                    kernel="6.1", checkpointer="criu 4.1.1")
    diffs = mismatches(rec, here)
    assert field_names(diffs) == ("kernel", "gpu_model", "gpu_count")
    assert "gpu_model: checkpoint=H100, here=A100" in diffs
    assert mismatches(rec, rec) == []


def test_fields_the_checkpoint_does_not_record_need_nothing() -> None:
    assert mismatches(Versions(), Versions(gpu_model="H100", kernel="x")) == []
    assert mismatches(Versions(gpu_count=2), Versions(gpu_count=8)) == []  # more GPUs is fine
    assert field_names(mismatches(Versions(gpu_count=2), Versions())) == ("gpu_count",)


def test_host_versions_reads_this_machine() -> None:
    import platform

    v = host_versions("criu 9.9")
    assert (v.cpu_arch, v.kernel, v.checkpointer) == (platform.machine(), platform.release(), "criu 9.9")


@pytest.mark.parametrize(("path", "target", "ok"), [("parent", "pre-1", True), ("a/parent", "../pre-1", True),
                                                    ("parent", "../x", False), ("parent", "/etc", False),
                                                    ("a/b", "../../x", False), ("parent", "pre-1/../..", False)])
def test_link_stays_inside(path: str, target: str, ok: bool) -> None:
    from gpudefrag.checkpoint.manifest import link_stays_inside

    assert link_stays_inside(path, target) is ok


@PROPS
@given(st.binary(max_size=200))
def test_any_key_file_content_is_a_key_or_an_insecure_key_error(tmp_path_factory, raw: bytes) -> None:
    import os

    from gpudefrag.checkpoint.keys import load_key

    p = tmp_path_factory.mktemp("k") / "key"
    p.write_bytes(raw)
    os.chmod(p, 0o600)
    try:
        key = load_key(p, create=False)
    except CheckpointError as e:
        assert e.reason == rc.INSECURE_KEY
    else:
        assert len(key) >= 16 and key == bytes.fromhex(raw.strip().decode())
