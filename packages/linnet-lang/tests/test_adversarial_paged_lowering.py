"""Adversarial cases of the paged KV cache, language side (issue 44 item 1): an entry input
whose declared size reads a config (a page table's `(S + kv_page_size - 1) / kv_page_size`
columns) is checked once every config is known (E0607), not skipped; the paged std ops
lower; a paged model lowers only its paged entries' states."""

from __future__ import annotations

import pytest
from linnet.lang import LinnetError, Program, lower
from linnet.lang.host.paged import check_paged_inputs, paged_config
from linnet.lang.ir.graph import Graph
from linnet.lang.syntax.program import model_file

PAGED_SOURCE = """
pub model M<B: Dim, S: Dim> {
    config page: Dim = 4
    entry run(table: Tensor[B, (S + page - 1) / page; i32]) -> Tensor[B; i32] {
        let first[b] = table[b, 0]
        return first
    }
}
"""


def test_input_size_that_reads_a_config_is_checked():
    prog = Program.from_text(PAGED_SOURCE, "m")
    lower(prog, "run", {"table": [2, 3]}, {"S": 10})  # ceil(10 / 4) = 3 columns
    with pytest.raises(LinnetError) as e:
        lower(prog, "run", {"table": [2, 5]}, {"S": 10})
    d = e.value.diagnostics[0]
    assert d.code == "E0607"
    assert "has size 5 along axis 1" in d.message and "gives 3" in d.message


def test_paged_llama_lowers_pages_only():
    prog = Program.from_file(model_file("std.models.llama"))
    cfg = {
        "V": 16, "D": 8, "F": 16, "NL": 1, "H": 2, "KV": 1, "HD": 4, "S": 10, "T": "f32",
        "kv_pages": 6, "kv_page_size": 4,
    }  # fmt: skip
    g = lower(prog, "decode_paged", {"token": [3], "pos": [3], "table": [3, 3]}, cfg)
    assert {tuple(v.shape) for v in g.states.values()} == {(6, 4, 1, 4)}
    with pytest.raises(LinnetError) as e:
        lower(prog, "decode", {"token": [3], "pos": [3]}, cfg)
    assert e.value.diagnostics[0].code == "E0340"  # the dense cache is absent


@pytest.mark.parametrize(
    "pages,size,config",
    [(1, 16, {}), (True, 16, {}), (4, -1, {}), (None, 4, {}), (8, 16, {"kv_page_size": 8})],
)
def test_bad_paged_config(pages, size, config):
    prog = Program.from_file(model_file("std.models.llama"))
    with pytest.raises(LinnetError) as e:
        paged_config(prog, pages, size, config)
    assert e.value.diagnostics[0].code == "E0688"


def test_paged_positions_past_s():
    g = Graph("decode_paged", "m", dims={"S": 8})
    check_paged_inputs(g, "decode_paged", {"pos": [0, 7]})
    with pytest.raises(LinnetError) as e:
        check_paged_inputs(g, "decode_paged", {"pos": [0, 8]})
    assert e.value.diagnostics[0].code == "E0690"
    p = Graph("prefill_paged", "m", dims={"S": 8})
    check_paged_inputs(p, "prefill_paged", {"start": [5], "n": [3]})
    with pytest.raises(LinnetError):
        check_paged_inputs(p, "prefill_paged", {"start": [5], "n": [4]})


def test_every_shipped_model_has_the_paged_entries() -> None:
    """linnet.serve needs `decode_paged` and `prefill_paged` of every model it serves: each
    std model declares both (a model added later without them is caught here)."""
    from linnet.lang import Program
    from linnet.lang.syntax.program import model_file

    root = model_file("std.models.llama").parent
    for path in sorted(root.glob("*.linnet")):
        text = Program.from_file(path)
        models = [
            item
            for module in text.modules.values()
            for item in module.items
            if getattr(item, "kind", None) == "model" and module.name.endswith(path.stem)
        ]
        assert len(models) == 1, (path.name, models)
        names = {m.name for m in models[0].methods if m.kind == "entry"}
        assert {"decode_paged", "prefill_paged"} <= names, (path.name, names)
