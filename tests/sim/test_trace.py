"""Trace loaders: valid files load exactly; a malformed field is reported with file, line and column."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudefrag.core.model import MILLI
from gpudefrag.errors import InputError
from gpudefrag.sim.trace import load_nodes, load_pods, load_trace

from .conftest import NODE_HEADER, POD_HEADER, pod_row, write_trace

names = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12)
pods_st = st.lists(
    st.tuples(st.integers(0, 96_000), st.integers(0, 8), st.integers(1, MILLI), st.sampled_from(["", "T4", "A|B"])),
    min_size=1, max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=pods_st)
def test_pod_list_round_trip(tmp_path: Path, pods):
    rows = []
    for i, (cpu, k, milli, spec) in enumerate(pods):
        m = 0 if k == 0 else (MILLI if k > 1 else milli)
        rows.append(pod_row(i, cpu, k, m, spec))
    _, p = write_trace(tmp_path, ["n0,1000,1000,1,T4"], rows)
    loaded = load_pods(p)
    assert len(loaded) == len(pods)
    for tp, (cpu, k, milli, spec) in zip(loaded, pods, strict=True):
        assert tp.pod.num_gpu == k and tp.pod.cpu_milli == cpu
        assert tp.pod.gpu_milli == (0 if k == 0 else (MILLI if k > 1 else milli))
        assert tp.pod.gpu_models == tuple(x for x in spec.split("|") if x)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(st.tuples(names, st.integers(0, 10**6), st.integers(0, 8), st.sampled_from(["", "G2"])),
                      min_size=1, max_size=20, unique_by=lambda t: t[0]))
def test_node_list_round_trip(tmp_path: Path, nodes):
    n, _ = write_trace(tmp_path, [f"{a},{c},{c},{g},{m}" for a, c, g, m in nodes], [pod_row(0, 1, 1, 500)])
    if not any(g for _, _, g, _ in nodes):  # a cluster without a GPU is refused, naming the gpu column
        with pytest.raises(InputError, match=r"line 1, column \d+ \(gpu\): no node has a GPU"):
            load_nodes(n)
        return
    loaded = load_nodes(n)
    assert [(x.name, x.cpu_milli, x.gpus, x.model or "") for x in loaded] == [(a, c, g, m) for a, c, g, m in nodes]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=st.integers(0, 4), field=st.sampled_from([1, 2, 3, 4]),
       junk=st.sampled_from(["x", "-5", "1.5", "", "99999999999999", "１"]))
def test_a_malformed_pod_field_names_file_line_and_column(tmp_path: Path, row, field, junk):
    rows = [pod_row(i, 4000, 1, 500) for i in range(5)]
    parts = rows[row].split(",")
    parts[field] = junk
    rows[row] = ",".join(parts)
    _, p = write_trace(tmp_path, ["n0,1000,1000,1,T4"], rows)
    col = sum(len(x) + 1 for x in parts[:field]) + 1
    try:
        load_pods(p)
    except InputError as e:
        assert e.source == str(p)
        assert e.where.startswith(f"line {row + 2}, column {col}")
    else:  # a few junk values are valid integers in some fields (e.g. "" is never, "-5" never)
        pytest.fail(f"accepted {junk!r} in field {field}")


def test_structural_errors(tmp_path: Path):
    n = tmp_path / "n.csv"
    n.write_text("sn,cpu_milli,gpu\nx,1,1\n")
    with pytest.raises(InputError, match="missing column"):
        load_nodes(n)
    n.write_text(NODE_HEADER + "\nx,1,1,1,T4\nx,1,1,1,T4\n")
    with pytest.raises(InputError, match=r"line 3, column 1.*duplicate"):
        load_nodes(n)
    n.write_text(NODE_HEADER + "\nx,1,1,1\n")
    with pytest.raises(InputError, match=r"line 2.*expected 5 fields"):
        load_nodes(n)
    with pytest.raises(InputError, match="file not found"):
        load_nodes(tmp_path / "absent.csv")
    n.write_text(NODE_HEADER + "\nx,1,1,0,T4\ny,1,1,0,\n")
    with pytest.raises(InputError, match=r"line 1, column 25 \(gpu\): no node has a GPU"):
        load_nodes(n)
    p = tmp_path / "p.csv"
    p.write_text(POD_HEADER + "\n" + pod_row(0, 1, 2, 500) + "\n")
    with pytest.raises(InputError, match="only valid with one GPU"):
        load_pods(p)
    p.write_text(POD_HEADER + "\n" + "p0,1,1,1,500,,LS,Running,10,5,1\n")
    with pytest.raises(InputError, match="deletion"):
        load_pods(p)
    # two pods of one name: any report keyed by name would merge them
    p.write_text(POD_HEADER + "\n" + pod_row(0, 1, 1, 500) + "\n" + pod_row(1, 1, 1, 300) + "\n"
                 + pod_row(0, 1, 1, 200) + "\n")
    with pytest.raises(InputError, match=r"line 4, column 1 \(name\): duplicate pod name .* \(first on line 2\)"):
        load_pods(p)


@pytest.mark.trace
def test_the_alibaba_trace_loads(alibaba_trace: Path):
    t = load_trace(alibaba_trace / "openb_node_list_gpu_node.csv", alibaba_trace / "openb_pod_list_default.csv")
    assert len(t.nodes) == 1213 and sum(n.gpus for n in t.nodes) == 6212
    assert len(t.pods) == 8152
    assert sum(p.pod.gpu_total for p in t.pods) == pytest.approx(6_086_800, abs=1)


FIVE = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=pods_st, extra=st.lists(st.sampled_from(["gpu_spec", "qos", "pod_phase", "creation_time"]),
                                    unique=True, max_size=4))
def test_the_five_study_columns_suffice_and_optional_ones_may_be_any_subset(tmp_path: Path, pods, extra):
    """The multigpu lists carry only the five columns: they load, with any subset of the optional columns."""
    header = FIVE.split(",") + extra
    lines = [",".join(header)]
    for i, (cpu, k, milli, spec) in enumerate(pods):
        m = 0 if k == 0 else (MILLI if k > 1 else milli)
        vals = {"gpu_spec": spec, "qos": "LS", "pod_phase": "Running", "creation_time": str(i)}
        lines.append(",".join([f"p{i}", str(cpu), "1024", str(k), str(m), *(vals[c] for c in extra)]))
    p = tmp_path / "pods.csv"
    p.write_text("\n".join(lines) + "\n")
    loaded = load_pods(p)
    for tp, (cpu, k, milli, spec) in zip(loaded, pods, strict=True):
        assert tp.pod.num_gpu == k and tp.pod.cpu_milli == cpu and tp.pod.memory_mib == 1024
        assert tp.pod.gpu_milli == (0 if k == 0 else (MILLI if k > 1 else milli))
        assert tp.pod.gpu_models == (tuple(x for x in spec.split("|") if x) if "gpu_spec" in extra else ())
        assert tp.creation_time == (float(tp.name[1:]) if "creation_time" in extra else None)


KNOWN = set(FIVE.split(",")) | {"gpu_spec", "qos", "pod_phase", "pod_phrase", "creation_time", "deletion_time",
                                 "scheduled_time"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 5), name=st.text(string.ascii_lowercase + "_ ", min_size=1, max_size=10),
       dup=st.booleans())
def test_an_unknown_or_repeated_column_names_line_1_and_its_column(tmp_path: Path, at, name, dup):
    header = FIVE.split(",")
    if dup:
        name = header[at % 5]
    elif name in KNOWN:
        name += "_x"
    header.insert(at, name)
    p = tmp_path / "pods.csv"
    p.write_text(",".join(header) + "\n" + pod_row(0, 1, 1, 500) + "\n")
    with pytest.raises(InputError, match="duplicate column" if dup else "unknown column") as e:
        load_pods(p)
    first = header.index(name)
    where = at if not dup else max(at, first if first != at else header.index(name, at + 1))
    assert e.value.source == str(p)
    assert e.value.where == f"line 1, column {sum(len(x) + 1 for x in header[:where]) + 1} ({name})"


def test_a_gpu_spec_naming_a_model_no_node_has(tmp_path: Path):
    n, p = write_trace(tmp_path, ["n0,1000,1000,1,T4", "n1,1000,1000,8,G2"],
                       [pod_row(0, 1, 1, 500, "T4"), pod_row(1, 1, 1, 500, "G2|V100M32")])
    with pytest.raises(InputError) as e:
        load_trace(n, p)
    col = len("p1,1,1024,1,500,") + 1
    assert e.value.source == str(p) and e.value.where == f"line 3, column {col} (gpu_spec)"
    assert "'V100M32'" in str(e.value)
    assert len(load_pods(p)) == 2  # without a cluster to check against, the list itself is valid


@pytest.mark.parametrize("milli", ["-1", "-500"])
def test_a_negative_gpu_milli_names_line_and_column(tmp_path: Path, milli):
    _, p = write_trace(tmp_path, ["n0,1000,1000,1,T4"], [pod_row(0, 1, 1, 500), f"p1,1,1024,1,{milli},,LS,R,1,2,1"])
    with pytest.raises(InputError, match=rf"must be in 0\.\.1000, got {milli}") as e:
        load_pods(p)
    assert e.value.where == f"line 3, column {len('p1,1,1024,1,') + 1} (gpu_milli)"


@pytest.mark.trace
def test_every_variant_of_the_study_loads(alibaba_trace: Path):
    nodes = alibaba_trace / "openb_node_list_gpu_node.csv"
    lists = sorted((alibaba_trace / "variants").glob("openb_pod_list_*.csv"))
    assert len(lists) == 11
    for f in lists:
        t = load_trace(nodes, f)
        assert len(t.pods) >= 8152
        if "gpuspec" in f.name:
            assert any(p.pod.gpu_models for p in t.pods)


def test_a_spreadsheet_export_with_a_byte_order_mark_and_crlf_loads_like_the_plain_file(tmp_path: Path):
    """Excel and LibreOffice put a UTF-8 BOM before the header and end lines with CRLF; the BOM is not part of
    the first column's name, so the file must load exactly like the plain one (and a bad byte after the BOM is
    still reported at its own offset)."""
    n, p = write_trace(tmp_path, ["n0,64000,262144,2,T4"], [pod_row(0, 4000, 1, 500), pod_row(1, 2000, 2, 1000)])
    plain = load_pods(p)
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes().replace(b"\n", b"\r\n"))
    n.write_bytes(b"\xef\xbb\xbf" + n.read_bytes().replace(b"\n", b"\r\n"))
    assert load_pods(p) == plain
    assert [x.name for x in load_nodes(n)] == ["n0"]
    raw = p.read_bytes()
    p.write_bytes(raw[:10] + b"\xff" + raw[10:])
    with pytest.raises(InputError, match=r"byte 10 \(line 1\)"):
        load_pods(p)
