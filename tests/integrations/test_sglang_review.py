"""The SGLang adapter's output paths after an adversarial review (2026-12-06): an ``o`` the merge cannot write (here one
sharing memory with ``q``, which SGLang's own two-stage kernel serves correctly: it reads all of q first) takes the
copies and must leave the gate the query as it was; the gate's repaired rows are written into ``o`` last, so a failure
anywhere before serves the first pass with its own record; the copies' rounding into ``o``'s dtype is in E⁺ as the
merge's own store is. Real ``sglang==0.5.23`` decode module, Triton interpreter (``test_sglang``'s set-up)."""

import importlib.util
import math

import pytest
import torch

from witcert.integrations.sglang import sglang_version  # noqa: E402

# the installed distribution (the adapter refuses a bare copy of its modules, e.g. the device run's carried decode
# module); not importorskip: sglang/__init__ needs the server stack
if importlib.util.find_spec("sglang") is None or sglang_version() is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
import witcert.integrations.sglang_decode as SD  # noqa: E402
from tests.integrations.test_sglang import (  # noqa: E402, F401 (_clean: the autouse fixture)
    HQ,
    MAX_SPLITS,
    SGL,
    D,
    _clean,
    _FakeStore,
    _metered_pool,
    exact_attention,
    fill,
    scenario,
)
from witcert.gate import Gate  # noqa: E402

FIELDS = ("tv_upper_a", "out_err_upper", "xi", "eps_max", "flag")
GATE_LOG: list = []  # the last _run's STATE.gate_log


def _call(q, o, pool, slots, indptr):
    B = q.shape[0]
    lse = torch.zeros(B, HQ, MAX_SPLITS)
    SGL.decode_attention_fwd(q, pool.k_buffer[0], pool.v_buffer[0], o, indptr, slots.int(),
                             torch.zeros(B, HQ, MAX_SPLITS, D), lse, torch.full((B,), MAX_SPLITS, dtype=torch.int32),
                             MAX_SPLITS, 1 / math.sqrt(D), 0.25, 0.25)
    return o.clone().view(B, HQ, D), lse, ws.STATE.records[-1][1]


def _run(o_is_q=False, gate=True, fail=None, monkeypatch=None):
    q, k, v, slots, indptr = scenario(2)
    g = dict(gate=Gate("risk-ranked", tau=0.3, max_pagein_blocks=4), exact_store=_FakeStore(k, v, slots)) if gate else {}
    ws.install(force=True, targets=("decode",), bare=True, **g)
    if fail is not None:
        monkeypatch.setattr(SD, fail, lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("injected")))
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, 0.25, 0.25)
    qbuf = q.clone()
    o = qbuf if o_is_q else torch.zeros(q.shape[0], HQ, D, dtype=q.dtype)
    o, lse, rec = _call(qbuf, o, pool, slots, indptr)
    report = ws.STATE.gate_log[-1] if ws.STATE.gate_log else None
    GATE_LOG[:] = ws.STATE.gate_log
    unmetered = dict(ws.STATE.unmetered)
    ws.uninstall()
    return o, lse, rec, report, unmetered, exact_attention(q, k, v, slots, indptr)


def test_an_o_over_the_query_leaves_the_gate_the_query():
    """Before: the copies overwrote q, and the gate re-decoded the repaired rows with the output as their query
    (their error 1.5-9.7 against E⁺ 0.14-2.3)."""
    o_sep, _, rec_sep, rep_sep, _, o_ex = _run(o_is_q=False)
    o_inp, _, rec_inp, rep_inp, unmetered, _ = _run(o_is_q=True)
    assert not unmetered and rep_sep.repaired_rows and rep_inp.repaired_rows == rep_sep.repaired_rows
    assert torch.equal(o_inp, o_sep)
    for f in FIELDS:
        assert torch.equal(getattr(rec_inp, f), getattr(rec_sep, f)), f
    err = (o_inp.double() - o_ex.view_as(o_inp)).norm(dim=-1)
    assert (err <= rec_inp.out_err_upper).all()


def test_a_gate_failure_serves_the_first_pass_with_its_record(monkeypatch):
    """A failure after the repair (injected where the adapter reads the unmetered rows) used to leave o holding the
    repaired rows beside the first pass's record; now o is written last and the failure serves the first pass whole."""
    o_ok, _, _, rep_ok, _, _ = _run()
    assert rep_ok.repaired_rows  # the gate does repair rows here
    o1, lse1, rec1, _, _, _ = _run(gate=False)
    o_f, lse_f, rec_f, _, unmetered, _ = _run(fail="bad_rows", monkeypatch=monkeypatch)
    assert any(k.startswith("gate: RuntimeError") for k in unmetered)
    assert torch.equal(o_f, o1) and not torch.equal(o_f, o_ok)
    assert torch.equal(lse_f[..., 0], lse1[..., 0])
    for f in FIELDS:
        assert torch.equal(getattr(rec_f, f), getattr(rec1, f)), f


def test_a_failed_write_saturates_the_rows_it_was_writing(monkeypatch):
    """A write of the repaired rows that fails part way: those rows' record is saturated (TV⁺ 1, E⁺ +inf, flagged),
    the other rows keep the first pass's."""
    import witcert.integrations.sglang_gate as SG

    real = SG.write_repaired

    def half(pending, o, lse, q):
        rows_t, new_o, new_lse = pending
        real((rows_t[:1], new_o[:1], new_lse[:1]), o, lse, q)
        raise RuntimeError("injected")

    rep_ok = _run()[3]
    o1, _, rec1, _, _, _ = _run(gate=False)
    monkeypatch.setattr(SG, "write_repaired", half)
    _, _, rec_f, rep_f, unmetered, _ = _run()
    rows = torch.tensor(rep_ok.repaired_rows)
    assert any(k.startswith("gate: RuntimeError") for k in unmetered)
    # the failed call's report alone, not beside the gate's report of repairs that were never served
    assert not rep_f.repaired_rows and all(not r.repaired_rows for r in GATE_LOG)
    assert rec_f.flag[rows].all() and (rec_f.tv_upper_a[rows] == 1).all() and torch.isinf(rec_f.out_err_upper[rows]).all()
    rest = torch.ones(rec1.flag.shape[0], dtype=torch.bool)
    rest[rows] = False
    assert torch.equal(rec_f.tv_upper_a[rest], rec1.tv_upper_a[rest])


def test_an_o_over_the_kv_cache_is_refused():
    """An ``o`` over SGLang's key buffer: decode refuses it, and the copies must not write it either (a second review:
    the next call was metered over overwritten codes at 2.39× its E⁺, unflagged)."""
    q, k, v, slots, indptr = scenario(0)
    ws.install(force=True, targets=("decode",), bare=True)
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, 0.25, 0.25)
    kb = pool.k_buffer[0]
    before = kb.clone()
    B, n = q.shape[0], q.shape[0] * HQ * D
    o_bad = kb.view(torch.uint8).view(-1)[: 2 * n].view(torch.bfloat16).view(B, HQ, D)
    with pytest.raises(SD.OutputOverCacheError, match="shares memory with an input of the decode"):
        _call(q.clone(), o_bad, pool, slots, indptr)
    assert torch.equal(kb.view(torch.uint8), before.view(torch.uint8))


def test_an_o_the_meter_cannot_bound_is_served_unmetered():
    """An ``o`` in float8 (its rounding is outside every bound: the review measured 6 of 8 rows above E⁺, up to 2.2×):
    SGLang's own kernel serves it, counted unmetered, and no record is emitted."""
    q, k, v, slots, indptr = scenario(2)
    ws.install(force=True, targets=("decode",), bare=True)
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, 0.25, 0.25)
    B = q.shape[0]
    lse = torch.zeros(B, HQ, MAX_SPLITS)
    SGL.decode_attention_fwd(q, pool.k_buffer[0], pool.v_buffer[0], torch.zeros(B, HQ, D, dtype=torch.float8_e4m3fn),
                             indptr, slots.int(), torch.zeros(B, HQ, MAX_SPLITS, D), lse,
                             torch.full((B,), MAX_SPLITS, dtype=torch.int32), MAX_SPLITS, 1 / math.sqrt(D), 0.25, 0.25)
    assert not ws.STATE.records
    assert any("o in torch.float8_e4m3fn" in key for key in ws.STATE.unmetered)
