"""Trace records (witcert.trace), the predicate parser, the trace views and plots, Prometheus."""

import dataclasses
import json
import pathlib
import shutil
import warnings

import numpy as np
import pytest

from tests.helpers.tiny import generate, record_fixture, tiny_model  # noqa: E402
from witcert import traceviews as V  # noqa: E402
from witcert.predicate import PredicateError, compile_predicate  # noqa: E402
from witcert.trace import FIELDS, VERSION, Tee, TraceError, Tracer, read_trace  # noqa: E402

FIXTURE = pathlib.Path(__file__).parents[1] / "data" / "tiny.trace.jsonl"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A freshly recorded trace of the tiny model, and its caches."""
    path = tmp_path_factory.mktemp("trace") / "run.trace.jsonl"
    caches = record_fixture(path)
    return path, caches


# --------------------------------------------------------------------------- schema round trip
def test_round_trip_matches_the_cache_records(recorded):
    path, caches = recorded
    t = read_trace(path)
    assert t.header.version == VERSION and t.header.meta["model"].startswith("tiny")
    assert t.configs() == ["kivi2", "kivi2 +gate", "int8_dither"]
    for name, cache in caches.items():
        sub = t.where(f"req == '{name}'")
        Hq = cache.num_q_heads
        assert len(sub) == len(cache.records) * Hq
        for rec in cache.records:
            rows = sub.select((sub["step"] == rec.step) & (sub["layer"] == rec.layer))
            order = np.argsort(rows["head"])
            np.testing.assert_array_equal(rows["tv"][order], rec.tv_a[0])
            np.testing.assert_array_equal(rows["tv_pre"][order], rec.tv_a_pre[0])
            np.testing.assert_array_equal(rows["err"][order], rec.out_err[0])
            np.testing.assert_array_equal(rows["tv_real"][order], rec.tv_real[0])
            assert (rows["kv_head"][order] == np.arange(Hq) // (Hq // cache.num_kv_heads)).all()
        # page-in bytes: the trace's per (step, layer, kv head) split adds up to the cache's account
        s = V.summarize(sub, by=("layer",))
        assert s.overall.pagein_blocks == int(cache.pagein_blocks.sum())
        assert s.overall.pagein_bytes == int(cache.pagein_bytes.sum())
        assert [g.pagein_bytes for g in s.groups] == [int(b) for b in cache.pagein_bytes[:, 0]]
    assert caches["kivi2 +gate"].pagein_bytes.sum() > 0
    dith = t.where("scheme == 'int8_dither'")
    assert dith["tier"][0] == "AB" and np.isfinite(dith["tv_b"]).all() and (dith["delta_b"] > 0).all()
    assert np.isnan(t.where("scheme == 'kivi2'")["tv_b"]).all()


def test_in_memory_tracer_equals_the_file(recorded):
    path, _ = recorded
    mem = Tracer(None)
    m = tiny_model()
    from witcert.cache import WitCertCache

    tee = Tee(mem, None)
    tee.new_request("kivi2")  # forwarded to the tracer
    generate(m, WitCertCache(m.config, scheme="kivi2", audit=True, trace=tee), n=40, new=4)
    a = mem.to_trace()
    b = read_trace(path).where("req == 'kivi2'")
    for f in FIELDS:
        if f.name != "time":
            np.testing.assert_array_equal(a[f.name], b[f.name], err_msg=f.name)


def test_optional_fields_missing_or_added_later(tmp_path):
    """StepRecords with fields added later (unmetered, delta_spent, eps_max) and without
    the optional ones; rows with unknown fields; rows lacking optional fields."""
    from witcert.cache import StepRecord

    @dataclasses.dataclass
    class Later(StepRecord):
        unmetered: np.ndarray = None
        delta_spent: float = None
        eps_max: np.ndarray = None

    class FakeCache:
        scheme, gate, num_kv_heads, block_size, head_dim, layers = "int8", None, 1, 16, 8, []
        records = []
        pagein_bytes = np.zeros((2, 1), dtype=np.int64)

    z = np.zeros((1, 2))
    rec = Later(step=1, layer=1, tv_a=z + 0.2, tv_a_pre=z + 0.3, out_err=z + np.inf, tv_b=z + 0.1,
                flag=np.array([[True, False]]), nonfinite=np.array([[True, False]]),
                pagein_blocks=np.zeros((1, 1), dtype=np.int64), unmetered=np.array([[False, True]]),
                delta_spent=1e-6, eps_max=np.array([[np.inf, 0.5]]))
    tr = Tracer(tmp_path / "t.jsonl")
    tr.record(rec, FakeCache())
    tr.close()
    with open(tmp_path / "t.jsonl", "a") as f:  # a row from a newer writer: unknown field, optional ones missing
        row = {"req": "x", "seq": 0, "step": 2, "layer": 0, "head": 0, "kv_head": 0, "scheme": "int8", "tier": "A",
               "tv": 0.5, "tv_pre": 0.5, "err": 1.0, "blocks": 0, "bytes": 0, "saturated": False, "nan": False,
               "budget_spent": False, "unmetered": False, "time": 0.0, "new_field_v1_1": [1, 2]}
        f.write(json.dumps(row) + "\n")
    t = read_trace(tmp_path / "t.jsonl")
    assert len(t) == 3
    assert t["unmetered"].tolist() == [False, True, False]
    assert t["nan"].tolist() == [True, False, False] and t["budget_spent"].tolist() == [False, False, False]
    assert np.isnan(t["err"][:2]).all() and t["err"][2] == 1.0  # inf is written as null
    assert t["delta_b"][:2].tolist() == [1e-6, 1e-6] and np.isnan(t["delta_b"][2])
    assert np.isnan(t["eps_max"][0]) and t["eps_max"][1] == 0.5
    assert np.isnan(t["tv_tanh"]).all() and t["tv"][2] == 0.5


# --------------------------------------------------------------------------- crash safety
def test_torn_last_line_is_skipped_with_a_warning_and_repaired_on_append(tmp_path):
    p = tmp_path / "t.jsonl"
    shutil.copy(FIXTURE, p)
    n = len(read_trace(p))
    full = p.read_bytes()
    last = full.rstrip(b"\n").rsplit(b"\n", 1)[1]
    # a crash mid-write: the last row cut in half
    p.write_bytes(full[: len(full) - len(last) // 2 - 1])
    with pytest.warns(UserWarning, match="torn last line"):
        t = read_trace(p)
    assert len(t) == n - 1 and t.skipped_torn == 1
    # appending first truncates the torn tail (at the first write), so nothing is glued to it
    tr = Tracer(p)
    m = tiny_model()
    from witcert.cache import WitCertCache

    tr.new_request("after-crash")
    with pytest.warns(UserWarning, match="torn last line"):
        generate(m, WitCertCache(m.config, scheme="int8", trace=tr), n=40, new=3)
    tr.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t2 = read_trace(p)
    assert len(t2) == n - 1 + tr.rows_written and tr.rows_written == 2 * 4 * 4
    assert (t2.where("req == 'after-crash'")["scheme"] == "int8").all()


def test_nothing_written_before_the_first_row(tmp_path):
    p = tmp_path / "new" / "sub" / "t.jsonl"
    tr = Tracer(p, min_tv=0.99)
    m = tiny_model()
    from witcert.cache import WitCertCache

    generate(m, WitCertCache(m.config, scheme="int8", trace=tr), n=24, new=2)  # int8: TV+ far below 0.99
    tr.close()
    assert tr.records_seen == 4 and tr.rows_written == 0 and not (tmp_path / "new").exists()
    tr = Tracer(p)
    generate(m, WitCertCache(m.config, scheme="int8", trace=tr), n=24, new=2)
    tr.close()
    assert len(read_trace(p)) == tr.rows_written == 4 * 4


def test_torn_header_and_corrupt_middle(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"kind": "header", "sche')
    with pytest.warns(UserWarning):
        with pytest.raises(TraceError, match="empty trace"):
            read_trace(p)
    lines = FIXTURE.read_bytes().split(b"\n")
    lines[5] = lines[5][:40]
    p.write_bytes(b"\n".join(lines))
    with pytest.raises(TraceError, match=r":6: corrupt line"):
        read_trace(p)
    p.write_text('{"kind": "header", "schema": "witcert.trace", "version": 99}\n')
    with pytest.raises(TraceError, match="version 99"):
        read_trace(p)
    with pytest.raises(TraceError, match="cannot append|version"):
        Tracer(p)


# --------------------------------------------------------------------------- record-time filters
def test_sampling_and_filters_at_record_time(tmp_path):
    full = read_trace(FIXTURE)
    record_fixture(tmp_path / "s.jsonl", {"sample_every": 2})
    assert set(read_trace(tmp_path / "s.jsonl")["step"].tolist()) == {2}
    record_fixture(tmp_path / "m.jsonl", {"min_tv": 0.005})
    m = read_trace(tmp_path / "m.jsonl")
    assert 0 < len(m) == int(np.sum(full["tv_pre"] > 0.005)) < len(full) and (m["tv_pre"] > 0.005).all()
    record_fixture(tmp_path / "w.jsonl", {"where": "layer >= 2 and scheme == 'kivi2'"})
    w = read_trace(tmp_path / "w.jsonl")
    assert len(w) == int(np.sum((full["layer"] >= 2) & (full["scheme"] == "kivi2"))) and (w["layer"] >= 2).all()
    with pytest.raises(ValueError):
        Tracer(None, sample_every=0)
    with pytest.raises(PredicateError):
        Tracer(None, where="layer >= ")


def test_tracing_off_costs_nothing():
    from witcert.cache import WitCertCache

    m = tiny_model()
    c = WitCertCache(m.config, scheme="int8")
    assert c.trace is None
    generate(m, c, n=24, new=2)
    assert len(c.records) == 4


# --------------------------------------------------------------------------- predicates
COLS = {"layer": np.array([0, 10, 20, 25]), "tv": np.array([0.05, 0.2, 0.15, np.nan]),
        "scheme": np.array(["kivi2", "int8", "kivi2", "int8"], dtype=object),
        "gate": np.array([None, "risk-ranked@0.9", None, None], dtype=object),
        "saturated": np.array([False, False, True, False])}
KINDS = {"layer": "int", "tv": "float", "scheme": "str", "gate": "str", "saturated": "bool"}


@pytest.mark.parametrize("expr,expected", [
    ("layer>=20 and tv>0.1", [False, False, True, False]),
    ("layer >= 20 && tv > 0.1", [False, False, True, False]),
    ("scheme == 'kivi2' or tv > 0.1", [True, True, True, False]),
    ('not (scheme = "kivi2")', [False, True, False, True]),
    ("saturated", [False, False, True, False]),
    ("!saturated and layer < 25", [True, True, False, False]),
    ("tv != 0.2", [True, False, True, False]),  # null (NaN) compares false
    ("gate == null", [True, False, True, True]),
    ("gate != null and layer > 1e0", [False, True, False, False]),
    ("0.1 < tv", [False, True, True, False]),
    ("layer > tv", [False, True, True, False]),
    ("((layer == 0))", [True, False, False, False]),
])
def test_predicate_evaluates(expr, expected):
    assert compile_predicate(expr, KINDS).evaluate(COLS).tolist() == expected


@pytest.mark.parametrize("expr", [
    "__import__('os').system('id')", "tv.__class__", "layer[0] > 1", "open('x')", "tv > 0.1; import os",
    "lambda: 1", "tv > 0.1 and", "", "   ", "tv >", "'a' == 'a'", "1 < 2", "scheme > 'a'", "tv == 'x'",
    "tv > null", "layer", "unknown_field > 1", "tv > 0.1 or or", "scheme == 'a\\'b'", "tv > ١", "tv > 1e",
    "(" * 40 + "layer > 1" + ")" * 40, "not " * 40 + "saturated", "layer > 1 and " * 200 + "tv > 0",
    "tv > 0.1 )", "(tv > 0.1", "tv > 0x10", "tv >> 1", "tv > 1 & layer > 2", "`ls`", "tv > $x",
])
def test_predicate_rejects(expr):
    with pytest.raises(PredicateError):
        compile_predicate(expr, KINDS)


def test_predicate_on_trace_uses_the_schema():
    t = read_trace(FIXTURE)
    sub = t.where("layer>=2 and tv>0.005 and gate == null")
    assert len(sub) and (sub["layer"] >= 2).all() and (sub["tv"] > 0.005).all()
    with pytest.raises(PredicateError, match="unknown field"):
        t.where("tvv > 1")


# --------------------------------------------------------------------------- views on the fixture
def test_summary_on_fixture():
    t = read_trace(FIXTURE)
    s = V.summarize(t, by=("layer",), taus=(0.01, 0.5))
    assert [g.key for g in s.groups] == [(0,), (1,), (2,), (3,)]
    assert sum(g.rows for g in s.groups) == len(t) == s.overall.rows == 144
    for g in (*s.groups, s.overall):
        assert g.p50 <= g.p90 <= g.p99 <= g.max <= 1
        assert 0 <= g.coverage[0] <= g.coverage[1] == 1.0
    assert s.overall.max == float(np.nanmax(t["tv"]))
    assert s.worst[0].value == s.overall.max and s.worst[0].config == "kivi2"
    assert s.overall.pagein_blocks == 24
    lh = V.summarize(t, by=("layer", "head"))
    assert len(lh.groups) == 16 and lh.groups[0].key == (0, 0)
    assert "cov@0.01" in V.format_summary(s)
    with pytest.raises(V.ViewError, match="no rows"):
        V.summarize(t.where("layer > 100"))


def test_top_and_compare_on_fixture():
    t = read_trace(FIXTURE)
    rows = V.top(t, k=5, field="tv_pre")
    assert len(rows) == 5 and [r.value for r in rows] == np.sort(t["tv_pre"])[::-1][:5].tolist()
    ung, gat = t.where("req == 'kivi2'"), t.where("req == 'kivi2 +gate'")
    c = V.compare(ung, gat, labels=("kivi2", "kivi2 +gate"))
    assert [r.key for r in c.rows] == [(0,), (1,), (2,), (3,)]
    # repair only lowers the bound the served attention gets: gated max <= ungated max per layer
    assert all(r.b.max <= r.a.max for r in c.rows)
    assert c.overall_a.pagein_blocks == 0 and c.overall_b.pagein_blocks == 24
    assert "kivi2 +gate" in V.format_compare(c)


def test_trace_cli_verbs_and_plots(tmp_path, capsys):
    from witcert import cli

    assert cli.main(["trace", "summary", str(FIXTURE), "--by", "config", "--tau", "0.01,0.5"]) == 0
    out = capsys.readouterr().out
    assert "kivi2 +gate" in out and "cov@0.01" in out
    assert cli.main(["trace", "top", str(FIXTURE), "-k", "3", "--where", "layer>=2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    best = V.top(read_trace(FIXTURE).where("layer>=2"), k=3)
    assert len(lines) == 4 and float(lines[1].split()[0]) == pytest.approx(best[0].value, abs=1e-4)
    assert cli.main(["trace", "compare", str(FIXTURE), str(FIXTURE), "--where-a", "req=='kivi2'",
                     "--where-b", "req=='kivi2 +gate'"]) == 0
    assert "page-ins: A 0 blocks" in capsys.readouterr().out
    assert cli.main(["trace", "plot", str(FIXTURE), "--out", str(tmp_path / "plots")]) == 0
    for f in ("risk_heatmap.png", "risk_steps.png", "risk_coverage.png", "pageins.png"):
        assert (tmp_path / "plots" / f).stat().st_size > 5000
    assert cli.main(["trace", "summary", str(FIXTURE), "--where", "layer > 100"]) == 2
    assert "no rows" in capsys.readouterr().err
    assert cli.main(["trace", "schema"]) == 0
    assert "| `tv` | float |" in capsys.readouterr().out


# --------------------------------------------------------------------------- Prometheus
def test_prometheus_metrics_count_the_records():
    pytest.importorskip("prometheus_client")
    from witcert.cache import Gate, WitCertCache
    from witcert.metrics import PrometheusMetrics

    m = tiny_model()
    pm = PrometheusMetrics(certify_tau=0.03)
    c = WitCertCache(m.config, scheme="kivi2", gate=Gate("risk-ranked", tau=0.0, max_pagein_blocks=1), trace=pm)
    generate(m, c, n=40, new=4)
    L, Hq = c.num_layers, c.num_q_heads
    assert sum(pm.value("witcert_rows_total", layer=str(i)) for i in range(L)) == 3 * L * Hq
    cert = sum(int((r.tv_a <= 0.03).sum()) for r in c.records)
    assert sum(pm.value("witcert_rows_certified_total", layer=str(i)) for i in range(L)) == cert
    assert sum(pm.value("witcert_pagein_bytes_total", layer=str(i)) for i in range(L)) == c.pagein_bytes.sum() > 0
    assert pm.value("witcert_tv_upper_count", layer="0", tier="A") == 3 * Hq
    assert "witcert_tv_upper_bucket" in pm.text()
    # every series carries the cache's scheme and the model (the config's model_type without a name)
    assert pm.value("witcert_rows_total", scheme="kivi2", model="llama") == 3 * L * Hq
    assert pm.value("witcert_rows_total", scheme="int8") == 0
    named = PrometheusMetrics(model="tiny-llama")
    named.record(c.records[0], c)
    assert named.value("witcert_tv_upper_count", layer="0", scheme="kivi2", model="tiny-llama", tier="A") == Hq


@pytest.mark.interpreter
def test_kernel_path_records_are_traced():
    """backend='kernel' (Triton; the interpreter on the CPU) records through the same hook."""
    import json as _json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers.tiny import CONFIG
    from witcert.cache import WitCertCache, use_witcert

    cfg = _json.loads(CONFIG.read_text())
    cfg.update(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64, hidden_size=128,
               intermediate_size=256, vocab_size=512)
    for k in ("_model_name_or_path", "architectures", "transformers_version"):
        cfg.pop(k, None)
    torch.manual_seed(0)
    m = use_witcert(LlamaForCausalLM(LlamaConfig(**cfg)).eval())
    tr = Tracer(None)
    c = WitCertCache(m.config, scheme="int8_dither", backend="kernel", delta_req=1e-3, trace=tr)
    generate(m, c, n=20, new=3)
    assert c.layers[0].paged is not None
    t = tr.to_trace()
    assert len(t) == len(c.records) * 2 == 8 and (t["tier"] == "AB").all()
    np.testing.assert_array_equal(t["tv"], np.concatenate([r.tv_a[0] for r in c.records]))
    assert (t["delta_b"] > 0).all() and np.isfinite(t["eps_max"]).all() and not t["budget_spent"].any()
