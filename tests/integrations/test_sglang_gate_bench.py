"""bench/sglang_h200.py's metered+gate column (``bench/sglang_gate_cell.gate_cell``): on the CPU (Triton interpreter)
with the real SGLang decode module, its counts are the gate's own on the cell, it leaves the adapter as it found it
(no gate, no store) whether the calls succeed or fail, and it refuses misuse."""

import importlib.util
import os
import sys

import pytest
import torch

from witcert.integrations.sglang import sglang_version

if importlib.util.find_spec("sglang") is None or sglang_version() is None:
    pytest.skip("sglang is not installed", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
from tests.integrations.test_sglang import (  # noqa: E402, F401 (_clean: the autouse fixture)
    SGL,
    _clean,
    _metered_pool,
    fill,
    scenario,
    sglang_decode,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from sglang_gate_cell import GateCell, gate_cell  # noqa: E402

SCALE = 0.25


def _cell(seed=2):
    """The adapter installed without a gate on an fp8 cell: the patched call, the slots and exact K / V, the ungated
    first pass's TV⁺ [B, Hq]."""
    q, k, v, slots, indptr = scenario(seed)
    ws.install(force=True, targets=("decode",), bare=True)
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, SCALE, SCALE)

    def call():
        return sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr, SCALE, SCALE)

    call()
    return call, slots, k, v, ws.STATE.records[-1][1].tv_upper_a.clone()


@pytest.mark.parametrize("quantile", [0.0, 0.5])
def test_counts_are_the_gates_on_the_cell(quantile):
    call, slots, k, v, tv = _cell()
    tau = float(torch.quantile(tv.double(), quantile)) * 0.999  # some rows over τ (all of them at 0)
    cell = gate_cell(ws, call, tau, 0, slots, k, v, iters=2)
    over = (tv > tau).any(-1)
    assert isinstance(cell, GateCell) and cell.tau == tau and cell.ms > 0
    assert cell.rows_over == int(over.sum()) > 0
    assert 0 < cell.rows_repaired <= cell.rows_over and cell.slots_paged > 0 and cell.rejected == 0
    assert cell.tv_pre_max == pytest.approx(float(tv.max()), rel=0, abs=0)
    assert cell.tv_post_max <= cell.tv_pre_max
    assert ws.STATE.gate is None and ws.STATE.exact_store is None and ws.STATE.on_record is None
    assert float(ws.STATE.records[-1][1].tv_upper_a.max()) == cell.tv_post_max  # (forwarded to the adapter's sink)
    rep = ws.STATE.gate_log[-1]  # the report the cell read: its counted call's
    assert (cell.rows_over, cell.rows_repaired, cell.slots_paged) == (len(rep.rows), len(rep.repaired_rows),
                                                                      len(rep.paged))


def test_no_row_over_tau_pages_nothing():
    call, slots, k, v, tv = _cell()
    cell = gate_cell(ws, call, min(0.999, float(tv.max()) * 1.5 + 1e-6), 0, slots, k, v, iters=1)
    assert (cell.rows_over, cell.rows_repaired, cell.slots_paged) == (0, 0, 0)
    assert cell.tv_post_max == cell.tv_pre_max
    assert "not capturable" in cell.line(cell.ms) and f"{1.0:.2f}×" in cell.line(cell.ms)


def test_adapter_restored_when_the_call_fails():
    call, slots, k, v, tv = _cell()

    def boom():
        raise RuntimeError("decode failed")

    with pytest.raises(RuntimeError, match="decode failed"):
        gate_cell(ws, boom, 0.0, 0, slots, k, v, iters=1)
    assert ws.STATE.gate is None and ws.STATE.exact_store is None and ws.STATE.on_record is None
    with pytest.raises(RuntimeError, match="no metered record"):
        gate_cell(ws, lambda: None, 0.0, 0, slots, k, v, iters=1)  # a call that never reaches the adapter
    assert ws.STATE.gate is None and ws.STATE.exact_store is None


def test_misuse_refused():
    from witcert.gate import Gate

    call, slots, k, v, tv = _cell()
    with pytest.raises(ValueError, match="iters"):
        gate_cell(ws, call, 0.1, 0, slots, k, v, iters=0)
    with pytest.raises(ValueError, match="tau"):
        gate_cell(ws, call, 1.5, 0, slots, k, v, iters=1)  # the certified policy's τ < 1
    assert ws.STATE.gate is None
    ws.STATE.gate = Gate("certified", tau=0.1)
    with pytest.raises(ValueError, match="already has a gate"):
        gate_cell(ws, call, 0.1, 0, slots, k, v, iters=1)
