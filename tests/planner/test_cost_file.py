"""`plan --costs FILE`: bandwidths, per-pair links and measured history from a JSON/YAML file; bad files are one
error naming the file and field (exit 2), whatever they contain."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.core.cost import GB
from gpudefrag.demo import demo_document
from gpudefrag.errors import InputError
from gpudefrag.policy.costs import cost_model_from_doc
from gpudefrag.snapshot import write_json_atomic


def test_file_sets_bandwidths_links_and_history():
    cm = cost_model_from_doc({
        "checkpoint_gbps": 4, "overhead_s": 0, "shared_storage": False,
        "links": [{"source": "a", "target": "b", "gbps": 10}],
        "history": [{"source": "a", "target": "c", "bytes": 10**10, "checkpoint_s": 1, "transfer_s": 4,
                     "restore_s": 5}],
    }, "costs.json")
    assert cm.checkpoint_bps == pytest.approx(10 * GB)  # the measured median wins over the configured 4 GB/s
    assert cm.restore_bps == pytest.approx(2 * GB)
    assert cm.bandwidth("a", "b") == pytest.approx(10 * GB)
    assert cm.bandwidth("a", "c") == pytest.approx(2.5 * GB)
    assert cm.overhead_s == 0


@pytest.mark.parametrize(("doc", "where"), [
    ({"transfer_gbps": 0}, "transfer_gbps"),
    ({"links": [{"source": "a", "target": "b"}]}, "links[0].gbps"),
    ({"history": [{"source": "a", "target": "b", "bytes": -1, "checkpoint_s": 1, "transfer_s": 1,
                   "restore_s": 1}]}, "history[0].bytes"),
    ({"bandwidth": 3}, "bandwidth"),
    ([1, 2], "(document)"),
])
def test_bad_documents_name_the_field(doc, where):
    with pytest.raises(InputError) as e:
        cost_model_from_doc(doc, "costs.yaml")
    assert e.value.source == "costs.yaml" and e.value.where == where


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**12) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(["checkpoint_gbps", "transfer_gbps", "restore_gbps", "overhead_s", "cold_start_s",
                        "shared_storage", "links", "history"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(keys, json_values, max_size=5) | json_values)
def test_any_document_gives_a_model_or_one_input_error(doc):
    try:
        cm = cost_model_from_doc(doc, "costs.json")
    except InputError as e:
        assert e.source == "costs.json" and e.message
    else:
        assert cm.checkpoint_bps > 0 and cm.transfer_bps > 0 and cm.restore_bps > 0


def test_cli_costs_option(tmp_path, cli):
    snap = tmp_path / "demo.json"
    write_json_atomic(snap, demo_document())
    slow = tmp_path / "slow.yaml"
    slow.write_text("transfer_gbps: 0.01\n")
    _, base, _ = cli(["plan", str(snap), "--json"])
    code, out, _ = cli(["plan", str(snap), "--json", "--costs", str(slow)])
    assert code == 0
    assert json.loads(out)["plan"]["total_cost_s"] > 10 * json.loads(base)["plan"]["total_cost_s"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("links: [{source: a}]\n")
    code, _, err = cli(["plan", str(snap), "--costs", str(bad)])
    assert code == 2 and "bad.yaml" in err and "links[0].target" in err
