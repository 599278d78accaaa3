"""In-process: every reader, fed generated hostile documents and special files, either loads or raises one
InputError (CheckpointError for the store) naming the file; never another exception, never a hang."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.checkpoint.manifest import parse_manifest
from gpudefrag.checkpoint.protocol import CheckpointError
from gpudefrag.engines.kubernetes.load import load_cluster_state, load_dump
from gpudefrag.errors import InputError
from gpudefrag.policy import load_policy
from gpudefrag.policy.costs import load_cost_model
from gpudefrag.sim.trace import load_nodes, load_pods
from gpudefrag.snapshot import load_snapshot
from gpudefrag.web.auth import read_token_file

from .conftest import (
    JSON_TOKENS,
    NODES_CSV,
    PODS_CSV,
    YAML_TOKENS,
    cost_doc,
    dump_doc,
    paths,
    policy_doc,
    snapshot_doc,
    special_files,
    with_token,
)

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
pytestmark = pytest.mark.timeout(300)

# (reader, a valid document, the file suffix it is read with)
READERS: dict[str, tuple[Callable[[Path], Any], Callable[[], Any], str]] = {
    "snapshot-json": (load_snapshot, snapshot_doc, ".json"),
    "snapshot-yaml": (load_snapshot, snapshot_doc, ".yaml"),
    "diagnose-snapshot": (load_cluster_state, snapshot_doc, ".json"),
    "dump": (load_dump, dump_doc, ".json"),
    "diagnose-dump": (load_cluster_state, dump_doc, ".json"),
    "policy": (load_policy, policy_doc, ".yaml"),
    "policy-json": (load_policy, policy_doc, ".json"),
    "cost": (load_cost_model, cost_doc, ".json"),
}


def _expect_input_error(read: Callable[[Path], Any], f: Path) -> InputError | None:
    try:
        read(f)
    except InputError as e:
        assert e.source == str(f), str(e)
        assert "\n" not in str(e), str(e)
        return e
    return None


@pytest.mark.parametrize("name", sorted(READERS))
def test_the_valid_document_loads(name: str, tmp_path: Path) -> None:
    """The baseline every mutation below starts from: without the hostile value the reader succeeds."""
    read, doc, suffix = READERS[name]
    f = tmp_path / f"doc{suffix}"
    f.write_text(with_token(doc(), next(iter(paths(doc()))), json.dumps(next(iter(_first_value(doc())))),
                            "yaml" if suffix == ".yaml" else "json"))
    read(f)


def _first_value(doc: Any) -> Any:
    first = next(iter(paths(doc)))
    cur = doc
    for k in first:
        cur = cur[k]
    yield cur


@pytest.mark.parametrize("name", sorted(READERS))
@PROPS
@given(data=st.data())
def test_a_hostile_value_anywhere_is_one_named_error_or_loads(name: str, tmp_path: Path, data: st.DataObject) -> None:
    read, make, suffix = READERS[name]
    doc = make()
    where = data.draw(st.sampled_from(list(paths(doc))), label="where")
    fmt = "yaml" if suffix == ".yaml" else "json"
    token = data.draw(st.sampled_from(YAML_TOKENS if fmt == "yaml" else JSON_TOKENS), label="token")
    f = tmp_path / f"hostile{suffix}"
    f.write_text(with_token(doc, where, token, fmt))
    e = _expect_input_error(read, f)
    if token in ("NaN", "Infinity", "-Infinity", '{"a": 1, "a": 2}', "{a: 1, a: 2}", ".nan", ".inf", "-.inf", "*a",
                 "9" * 5000, str(10**30), "[" * 100_000 + "]" * 100_000):
        assert e is not None, f"{token[:20]} at {where} was accepted"


@pytest.mark.parametrize("name", sorted(READERS))
@PROPS
@given(data=st.data())
def test_truncated_or_corrupted_bytes_are_one_named_error_or_load(name: str, tmp_path: Path,
                                                                   data: st.DataObject) -> None:
    read, make, suffix = READERS[name]
    raw = with_token(make(), next(iter(paths(make()))), '"x"', "yaml" if suffix == ".yaml" else "json").encode()
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    junk = data.draw(st.binary(max_size=8) | st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"]),
                     label="junk")
    f = tmp_path / f"broken{suffix}"
    f.write_bytes(raw[:cut] + junk + raw[cut + len(junk):])
    _expect_input_error(read, f)


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "dev-null-link", "directory", "link-to-fifo"])
@pytest.mark.timeout(20)
def test_special_files_are_refused_without_reading(name: str, kind: str, tmp_path: Path) -> None:
    read = READERS[name][0]
    f = special_files(tmp_path)[kind]
    tracemalloc.start()
    try:
        e = _expect_input_error(read, f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e is not None and ("not a regular file" in e.message or "folder holds no" in e.message), e
    assert peak < 16 << 20  # nothing of /dev/zero was read


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 ) -> None:
    f = tmp_path / "big.json"
    f.write_text(json.dumps(snapshot_doc()))
    monkeypatch.setenv("GPUDEFRAG_MAX_INPUT_BYTES", "1000")
    e = _expect_input_error(load_snapshot, f)
    assert e is not None and "1,000-byte limit" in e.message and "GPUDEFRAG_MAX_INPUT_BYTES" in e.message
    monkeypatch.setenv("GPUDEFRAG_MAX_INPUT_BYTES", "lots")
    with pytest.raises(InputError, match="GPUDEFRAG_MAX_INPUT_BYTES"):
        load_snapshot(f)
    monkeypatch.delenv("GPUDEFRAG_MAX_INPUT_BYTES")
    load_snapshot(f)


# ---------------------------------------------------------------------------------------------- CSV traces
CSV_VALUES = st.sampled_from(["9" * 5000, "-" + "9" * 30, "1e999", "nan", "inf", "", " 5", "1_000", "٣", "0x10",
                              '"', "a,b"]) | st.text(max_size=6)


@PROPS
@given(data=st.data())
def test_a_hostile_csv_field_is_one_named_error_or_loads(tmp_path: Path, data: st.DataObject) -> None:
    which = data.draw(st.sampled_from(["nodes", "pods"]))
    text, read = (NODES_CSV, load_nodes) if which == "nodes" else (PODS_CSV, load_pods)
    lines = [ln.split(",") for ln in text.splitlines()]
    row = data.draw(st.integers(1, len(lines) - 1))
    col = data.draw(st.integers(0, len(lines[0]) - 1))
    lines[row][col] = data.draw(CSV_VALUES)
    f = tmp_path / f"{which}.csv"
    f.write_text("\n".join(",".join(ln) for ln in lines) + "\n")
    e = _expect_input_error(read, f)
    numeric = ("cpu_milli", "memory_mib", "gpu", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
    if lines[row][col] in ("9" * 5000, "1e999", "nan", "inf") and lines[0][col] in numeric:
        assert e is not None and lines[0][col] in e.where, (lines[0][col], e)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory"])
@pytest.mark.timeout(20)
def test_csv_special_files_are_refused(kind: str, tmp_path: Path) -> None:
    f = special_files(tmp_path)[kind]
    for read in (load_nodes, load_pods):
        e = _expect_input_error(read, f)
        assert e is not None and "not a regular file" in e.message


# ---------------------------------------------------------------------------------------------- store and tokens
def _manifest_doc() -> dict[str, Any]:
    from gpudefrag.checkpoint.manifest import CompatRecord, FileEntry, Manifest
    m = Manifest(id="wl-1", workload_id="wl", backend="criu", mode="dump", created_at="2026-01-01T00:00:00Z",
                 created_unix=1.0, files=(FileEntry(path="pages-1.img", size=3, sha256="a" * 64),),
                 compat=CompatRecord(cpu_arch="x86_64"), key_id="0" * 16).sign(b"k" * 32)
    return json.loads(m.to_json())


@PROPS
@given(data=st.data())
def test_a_hostile_manifest_value_is_a_bad_manifest_naming_the_field(data: st.DataObject) -> None:
    doc = _manifest_doc()
    where = data.draw(st.sampled_from(list(paths(doc))))
    token = data.draw(st.sampled_from(JSON_TOKENS))
    try:
        parse_manifest(with_token(doc, where, token).encode(), "m.json")
    except CheckpointError as e:
        assert e.reason in ("bad-manifest", "unsafe-path") and "\n" not in str(e)
        if token in ("NaN", "Infinity", "9" * 5000):
            assert e.reason == "bad-manifest"
        if token in ("NaN", "Infinity"):
            assert e.detail.startswith(str(where[0])), (where, e.detail)  # names the field, not just the file
    else:
        assert token not in ("NaN", "Infinity", "9" * 5000, "[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory", "link-to-fifo"])
@pytest.mark.timeout(20)
def test_a_token_file_that_is_not_a_regular_file_is_refused(kind: str, tmp_path: Path) -> None:
    f = special_files(tmp_path)[kind]
    with pytest.raises(InputError, match="not a regular file"):
        read_token_file(f)


def test_a_huge_token_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("a" * 100_000)
    with pytest.raises(InputError, match="limit"):
        read_token_file(f)


# ---------------------------------------------------------------------------------------------- run folder
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory", "link-to-fifo"])
@pytest.mark.timeout(20)
def test_a_job_planted_status_file_never_hangs_the_controller(kind: str, tmp_path: Path) -> None:
    """status.json lives in a folder the job's user writes and the controller (root) reads: a FIFO there hung
    `has_wrapper`, a link to /dev/zero read until memory ran out. Now it counts as no status at all."""
    from gpudefrag.control.agent import FileAgent, JobDir

    jd = JobDir(tmp_path / "run", "job-1")
    jd.root.mkdir(parents=True)
    special = special_files(tmp_path)[kind]
    if kind in ("fifo", "directory"):
        special.rename(jd.status)
    else:
        jd.status.symlink_to(special.resolve() if kind == "link-to-fifo" else special.readlink())
    assert FileAgent(tmp_path / "run", store=None).has_wrapper("job-1") is False


def test_a_status_file_with_hostile_json_counts_as_absent(tmp_path: Path) -> None:
    from gpudefrag.control.agent import JobDir, read_json

    jd = JobDir(tmp_path / "run", "job-1")
    jd.root.mkdir(parents=True)
    for text in ('{"phase": "running", "phase": "exited"}', "[1]", "[" * 100_000, '{"phase": NaN}'):
        jd.status.write_text(text)
        assert read_json(jd.status) is None
    jd.status.write_text('{"phase": "running"}')
    assert read_json(jd.status) == {"phase": "running"}


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000 + "]" * 100_000, "a: &x [1]\nb: *x\n", "{a: 1, a: 2}"])
def test_a_hostile_autoscaler_status_is_unreadable_not_a_crash(text: str) -> None:
    """The cluster-autoscaler status ConfigMap comes from the API: deep nesting was a RecursionError."""
    from gpudefrag.engines.kubernetes.autoscaler import _parse_yaml

    assert _parse_yaml(text) is None


# ---------------------------------------------------------------------------------------------- the fast parse
def _careful(raw: bytes) -> Any:
    """The guarded `json` parse alone (what parse_json ran before the fast path), or the InputError's message."""
    from gpudefrag import fileio

    try:
        return ("doc", json.loads(fileio.decode_text(raw, "x"), object_pairs_hook=fileio._pairs,
                                  parse_constant=fileio._constant, parse_int=fileio.bounded_int,
                                  parse_float=fileio.finite_float))
    except (ValueError, RecursionError, InputError) as e:
        return ("refused", type(e).__name__)


@PROPS
@given(data=st.data())
def test_the_fast_parse_returns_the_careful_parse_or_steps_aside(data: st.DataObject) -> None:
    """fileio.fast_json (msgspec) returns exactly what the guarded parse returns, or REFUSED where that parse
    refuses (it then names the place): hostile tokens anywhere in each reader's document, repeated keys, BOMs."""
    from gpudefrag import fileio

    doc = data.draw(st.sampled_from([snapshot_doc, dump_doc, policy_doc, cost_doc]), label="doc")()
    where = data.draw(st.sampled_from(list(paths(doc))), label="where")
    token = data.draw(st.sampled_from(JSON_TOKENS) | st.sampled_from(
        ['"x:y"', '"x\\u003ay"', "9223372036854775807", "-9223372036854775808", "1.5e-300", '"\\u00e9"',
         '{"b": 1, "c": {"b": 2, "b": 3}}', "[1, 2.5, true, null]"]), label="token")
    raw = with_token(doc, where, token).encode()
    if data.draw(st.booleans(), label="bom"):
        raw = b"\xef\xbb\xbf" + raw
    fast, careful = fileio.fast_json(fileio.drop_bom(raw)), _careful(raw)
    if fast is fileio.REFUSED:
        return  # the careful parse speaks (it may also accept: a ':' spelled as an escape, a 19-digit literal)
    assert careful == ("doc", fast), (where, token[:40])
