"""SGLang integration (issue 12) with the real ``sglang==0.5.23`` package, Triton interpreter.

SGLang's ``decode_attention_fwd`` is the package's own code (imported without running
``sglang/__init__``, whose server dependencies are not installed here). Its KV pool module
(``sglang.srt.mem_cache.memory_pool``) cannot be imported on this CPU machine (it needs
torchvision and the server stack), so the pool wrapper is exercised on ``tests.helpers.sglang_standin.StandInPool``, a
stand-in with the same ``set_kv_buffer`` signature and the same write semantics as SGLang's
MHA pool on the page-size-1 path (divide by the scale in place, cast, store at ``loc``); the
real class's signature is checked statically against the installed source.
"""

import ast
import importlib.util  # noqa: E402
import math
import os

import pytest
import torch

from witcert.integrations.sglang import sglang_version  # noqa: E402

# the installed distribution (the adapter refuses a bare copy of its modules, e.g. the device run's carried decode
# module); not importorskip: sglang/__init__ needs the server stack
if importlib.util.find_spec("sglang") is None or sglang_version() is None:
    pytest.skip("pip install --no-deps sglang==0.5.23 (Makefile)", allow_module_level=True)

import witcert.integrations.sglang as ws  # noqa: E402
from kernels.key_levels import key_edges  # noqa: E402
from tests.helpers.sglang_standin import Layer as _Layer  # noqa: E402
from tests.helpers.sglang_standin import MeteredStandInPool, StandInPool  # noqa: E402
from witcert import bounds as B  # noqa: E402

SGL = ws.import_bare(ws.DECODE_MODULE)
ORIG_DECODE = SGL.decode_attention_fwd
D, HKV, GQ, SIZE = 64, 2, 2, 48
HQ = HKV * GQ
MAX_SPLITS = 2


def _pool(dtype, layers=1, heads=HKV):
    return StandInPool(dtype, SIZE, heads, D, layers)


def _metered_pool(dtype, layers=1, heads=HKV):
    return MeteredStandInPool(dtype, SIZE, heads, D, layers)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(ws.ENV, raising=False)
    ws.uninstall()
    yield
    ws.uninstall()
    assert SGL.decode_attention_fwd is ORIG_DECODE


def scenario(seed=0, lens=(5, 11), outliers=True):
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(SIZE, generator=g)[: sum(lens)]
    k = torch.randn(sum(lens), HKV, D, generator=g)
    if outliers:
        k[..., :2] *= 8
    v = torch.randn(sum(lens), HKV, D, generator=g)
    q = (torch.randn(len(lens), HQ, D, generator=g) * 1.5).bfloat16()
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return q, k.bfloat16(), v.bfloat16(), slots, indptr


def fill(pool, k, v, slots, k_scale=None, v_scale=None):
    for part in (slice(0, 3), slice(3, None)):  # a prefill and an append
        pool.set_kv_buffer(_Layer(0), slots[part], k[part].clone(), v[part].clone(), k_scale, v_scale)


def sglang_decode(fn, q, pool, slots, indptr, k_scale=1.0, v_scale=1.0, layer=0):
    Bsz = q.shape[0]
    o = torch.zeros(Bsz, HQ * D, dtype=q.dtype)
    logits = torch.zeros(Bsz, HQ, MAX_SPLITS, D, dtype=torch.float32)
    lse = torch.zeros(Bsz, HQ, MAX_SPLITS, dtype=torch.float32)
    splits = torch.full((Bsz,), MAX_SPLITS, dtype=torch.int32)
    fn(q, pool.k_buffer[layer], pool.v_buffer[layer], o.view(Bsz, HQ, D), indptr, slots.int(), logits, lse, splits,
       MAX_SPLITS, 1 / math.sqrt(D), k_scale, v_scale)
    return o.view(Bsz, HQ, D), lse


# ---------------------------------------------------------------- (a) switch off


def test_switch_off_touches_nothing_and_is_bit_identical():
    q, k, v, slots, indptr = scenario()
    pool = _pool(torch.bfloat16)
    fill(pool, k, v, slots)
    ref_o, ref_lse = sglang_decode(ORIG_DECODE, q, pool, slots, indptr)
    assert ws.install() is None and not ws.installed()  # WITCERT_SGLANG unset
    os.environ[ws.ENV] = "0"
    assert ws.install() is None and not ws.installed()
    assert SGL.decode_attention_fwd is ORIG_DECODE
    pool2 = _pool(torch.bfloat16)
    fill(pool2, k, v, slots)
    assert torch.equal(pool2.k_buffer[0], pool.k_buffer[0]) and torch.equal(pool2.v_buffer[0], pool.v_buffer[0])
    o, lse = sglang_decode(SGL.decode_attention_fwd, q, pool2, slots, indptr)
    assert torch.equal(o, ref_o) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, None), (torch.float8_e4m3fn, 0.5)])
def test_wrapped_write_stores_what_sglang_stores(dtype, scale):
    """Even with the meter on, SGLang's own pool contents are bit-identical."""
    q, k, v, slots, indptr = scenario(1)
    plain, metered = _pool(dtype), _metered_pool(dtype)
    fill(plain, k, v, slots, scale, scale)
    fill(metered, k, v, slots, scale, scale)
    assert torch.equal(plain.k_buffer[0].view(torch.uint8), metered.k_buffer[0].view(torch.uint8))
    assert torch.equal(plain.v_buffer[0].view(torch.uint8), metered.v_buffer[0].view(torch.uint8))


# ---------------------------------------------------------------- (c) versions, never half-patch


def test_unsupported_version_refused():
    with pytest.raises(ws.UnsupportedSGLang, match="supports sglang 0.5.23; found 0.5.22"):
        ws.install(force=True, version="0.5.22", targets=("decode",), bare=True)
    assert not ws.installed() and SGL.decode_attention_fwd is ORIG_DECODE
    assert ws.sglang_version() == "0.5.23"


def test_unimportable_target_patches_nothing(monkeypatch):
    import sys

    if ws.POOL_MODULE in sys.modules:  # tests/helpers/sglang_pool.py imported it (stubbed server stack)
        monkeypatch.setattr(ws, "POOL_MODULE", "sglang.srt.mem_cache.no_such_pool")
    # the pool module needs SGLang's server stack (torchvision, …), absent here: all or nothing
    with pytest.raises(ws.UnsupportedSGLang, match="nothing was patched"):
        ws.install(force=True, bare=True)
    assert not ws.installed() and SGL.decode_attention_fwd is ORIG_DECODE


def test_changed_signature_refused(monkeypatch):
    monkeypatch.setattr(SGL, "decode_attention_fwd", lambda q, k_buffer, v_buffer, o, kv_indptr: None)
    with pytest.raises(ws.UnsupportedSGLang, match="expected parameters"):
        ws.install(force=True, targets=("decode",), bare=True)
    assert not ws.installed()
    monkeypatch.setattr(SGL, "decode_attention_fwd", ORIG_DECODE)


def test_pool_signature_of_installed_source():
    import importlib.util

    root = os.path.dirname(importlib.util.find_spec("sglang").origin)
    tree = ast.parse(open(os.path.join(root, "srt", "mem_cache", "memory_pool.py")).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ws.POOL_CLASS)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "set_kv_buffer")
    assert tuple(a.arg for a in fn.args.args)[: len(ws.POOL_PARAMS)] == ws.POOL_PARAMS


# ---------------------------------------------------------------- (b) switch on


def attention64(q, pool, slots, indptr, ks, vs):
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.zeros(q.shape[:2], dtype=torch.float64)
    for b in range(q.shape[0]):
        loc = slots[int(indptr[b]) : int(indptr[b + 1])]
        for hq in range(HQ):
            kh = pool.k_buffer[0][loc, hq // GQ].double() * ks
            vh = pool.v_buffer[0][loc, hq // GQ].double() * vs
            s_ = kh @ q[b, hq].double() / math.sqrt(D)
            o[b, hq] = torch.softmax(s_, 0) @ vh
            lse[b, hq] = torch.logsumexp(s_, 0)
    return o, lse


@pytest.mark.xfail(reason="SGLang 0.5.23's decode_attention_fwd returns wrong values under Triton 3.7.1's "
                          "interpreter on these inputs (o ~ 1e8, NaN warnings); not diagnosed", strict=False)
def test_sglang_kernel_under_interpreter():
    q, k, v, slots, indptr = scenario(2)
    pool = _pool(torch.bfloat16)
    fill(pool, k, v, slots)
    o, _ = sglang_decode(ORIG_DECODE, q, pool, slots, indptr)
    o_ref, _ = attention64(q, pool, slots, indptr, 1.0, 1.0)
    assert (o.double() - o_ref).abs().max().item() <= 2**-8 * float(o_ref.abs().max()) + 1e-4


def exact_checks(rec, q, pool, k, v, slots, indptr, ks, vs, scheme_cache=None):
    sigma = 1 / math.sqrt(D)
    groups = B.group_slices(D, 1)
    for b in range(q.shape[0]):
        sl = slice(int(indptr[b]), int(indptr[b + 1]))
        loc = slots[sl]
        n = loc.numel()
        for hq in range(HQ):
            h = hq // GQ
            kh = pool.k_buffer[0][loc, h].double() * ks
            vh = pool.v_buffer[0][loc, h].double() * vs
            kx, vx = k[sl, h].double(), v[sl, h].double()
            qq = q[b, hq].double()
            side = next(iter(ws.STATE.layers.values()))
            W = side.k_wit[loc, h, 0].double()
            assert torch.all(W[:, 0] >= (kh - kx).norm(dim=-1))
            assert torch.all(side.v_wit[loc, h, 0].double() >= (vh - vx).norm(dim=-1))
            eps = B.logit_radius(qq, W, groups, sigma, block_size=1, n=n)
            p_hat = torch.softmax(sigma * (kh @ qq), 0)
            tv = rec.tv_upper_a[b, hq].item()
            if n <= 12:
                assert tv >= B.tv_sup_bruteforce(p_hat, eps).item()
            assert tv >= B.tv_bound_tilt(p_hat, eps, tol=2**-14).item() - 2**-14 - 1e-7
            # kernel tolerance vs witcert.bounds on the same inputs (tests/kernels/test_kernels_conformance.py)
            xi, rho = rec.xi[b, hq].item(), rec.rho[b, hq].item()
            qn = sigma * qq.norm().item() * (1 + 2**-10)
            eps_k = qn * W.norm(dim=-1) + xi
            lv = qn * key_edges().double() + xi  # the kernel's √2 level grid
            ref = min(B.tv_bound_tanh(eps_k).item(), B.tv_bound_eform(p_hat, eps_k).item(),
                      B.tv_bound_tilt(p_hat, eps_k, levels=lv).item())
            assert tv <= ref + 1 / 64 + math.tanh(xi / 2) + rho + 4 * xi + 1e-6
            p = torch.softmax(sigma * (kx @ qq), 0)
            assert B.tv(p, p_hat).item() <= tv
            assert ((p_hat @ vh) - (p @ vx)).norm().item() <= rec.out_err_upper[b, hq].item()


@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, None), (torch.float8_e4m3fn, 0.25)])
def test_switch_on_meters_sglang_cache(dtype, scale, monkeypatch):
    monkeypatch.setenv(ws.ENV, "1")
    got = []
    patched = ws.install(targets=("decode",), bare=True, on_record=lambda lid, r: got.append((lid, r)))
    assert patched == [f"{ws.DECODE_MODULE}.{ws.DECODE_FN}"] and SGL.decode_attention_fwd is not ORIG_DECODE
    q, k, v, slots, indptr = scenario(2)
    pool = _metered_pool(dtype)
    fill(pool, k, v, slots, scale, scale)
    ks = vs = 1.0 if scale is None else scale
    o, lse = sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr, ks, vs)
    assert not ws.STATE.unmetered, dict(ws.STATE.unmetered)
    # SGLang's attention output, computed in fp64 from SGLang's stored values (what its kernel
    # computes; its own Triton kernel is not usable as the reference here, see
    # test_sglang_kernel_under_interpreter). Stated tolerance: one bf16 rounding of the output
    # (2^-8 relative to max |o|) + 1e-4.
    o_ref, lse_ref = attention64(q, pool, slots, indptr, ks, vs)
    tol = 2**-8 * float(o_ref.abs().max()) + 1e-4
    assert (o.double() - o_ref).abs().max().item() <= tol
    assert torch.allclose(lse[..., 0].double(), lse_ref, atol=1e-4)
    assert len(got) == 1 and got[0][0] == 0
    rec = got[0][1]
    assert rec.tv_upper_a.shape == (2, HQ) and not rec.flag.any()
    exact_checks(rec, q, pool, k, v, slots, indptr, ks, vs)
    if dtype == torch.bfloat16:
        assert rec.tv_upper_a.max() < 1e-3  # exact cache: only the kernel's fp terms
    else:
        assert rec.tv_upper_a.max() > 1e-3


def test_output_buffers_the_merge_cannot_write_take_the_copies():
    """SGLang's ``o`` in a dtype the merge does not write (float64): ``decode`` refuses it before any launch
    (``OutputBufferError``) and the adapter decodes again without it and copies, as before the merge wrote ``o``
    itself: the same record (E⁺ but for the bf16 store's rounding, which the float64 copy does not make), lse and −inf
    columns, the output within one bf16 rounding of the written one."""
    got = []
    ws.install(force=True, targets=("decode",), bare=True, on_record=lambda lid, r: got.append(r))
    q, k, v, slots, indptr = scenario(2)
    pool = _metered_pool(torch.bfloat16)
    fill(pool, k, v, slots)
    o, lse = sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr)
    o64 = torch.zeros(q.shape[0], HQ, D, dtype=torch.float64)
    lse64 = torch.zeros_like(lse)
    SGL.decode_attention_fwd(q, pool.k_buffer[0], pool.v_buffer[0], o64, indptr, slots.int(),
                             torch.zeros(q.shape[0], HQ, MAX_SPLITS, D), lse64,
                             torch.full((q.shape[0],), MAX_SPLITS, dtype=torch.int32), MAX_SPLITS, 1 / math.sqrt(D), 1.0, 1.0)
    assert not ws.STATE.unmetered and len(got) == 2
    assert torch.equal(lse64, lse) and torch.isneginf(lse[..., 1:]).all()
    assert (o64 - o.double()).abs().max().item() <= 2**-8 * float(o64.abs().max())
    for f in ("tv_upper_a", "flag"):
        assert torch.equal(getattr(got[0], f), getattr(got[1], f)), f
    want = B.stored_output_error_bound(got[1].out_err_upper, o64, "bfloat16", "float32")
    assert torch.allclose(got[0].out_err_upper, want, rtol=2.0**-30, atol=0.0)


def test_unmeterable_call_falls_back_and_is_counted(monkeypatch):
    ws.install(force=True, targets=("decode",), bare=True)
    q, k, v, slots, indptr = scenario(3)
    pool = _pool(torch.bfloat16)  # unwrapped pool: no side buffers registered
    fill(pool, k, v, slots)
    o, _ = sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr)
    o_ref, _ = sglang_decode(ORIG_DECODE, q, pool, slots, indptr)
    assert torch.equal(o, o_ref)
    assert ws.STATE.unmetered["decode: no patched write registered this buffer"] == 1


def test_refuses_dither_scheme():
    with pytest.raises(ValueError, match="logical index"):
        ws.install(force=True, scheme="int8_dither", targets=("decode",), bare=True)
    assert not ws.installed()


# ---------------------------------------------------------------- (d) tensor parallelism


def test_tp_ranks_reduce_to_single_rank():
    q, k, v, slots, indptr = scenario(4)

    def run(heads_kv, heads_q):
        got = []
        ws.install(force=True, targets=("decode",), bare=True, on_record=lambda lid, r: got.append(r))
        pool = _metered_pool(torch.float8_e4m3fn, heads=len(heads_kv))
        fill(pool, k[:, heads_kv].contiguous(), v[:, heads_kv].contiguous(), slots, 0.25, 0.25)
        Bsz, hq = q.shape[0], q[:, heads_q].contiguous()
        o = torch.zeros(Bsz, len(heads_q), D, dtype=q.dtype)
        logits = torch.zeros(Bsz, len(heads_q), MAX_SPLITS, D)
        lse = torch.zeros(Bsz, len(heads_q), MAX_SPLITS)
        SGL.decode_attention_fwd(hq, pool.k_buffer[0], pool.v_buffer[0], o, indptr, slots.int(), logits, lse,
                                 torch.full((Bsz,), MAX_SPLITS, dtype=torch.int32), MAX_SPLITS, 1 / math.sqrt(D),
                                 0.25, 0.25)
        ws.uninstall()
        return got[0], o

    single, o1 = run(list(range(HKV)), list(range(HQ)))
    tp = 2  # SGLang: rank r holds kv heads [r·Hkv/tp, …) and query heads [r·Hq/tp, …)
    ranks = [run(list(range(r * HKV // tp, (r + 1) * HKV // tp)), list(range(r * HQ // tp, (r + 1) * HQ // tp)))
             for r in range(tp)]
    red = ws.reduce_tp_records([r[0] for r in ranks])
    for f in ("tv_upper_a", "out_err_upper", "eps_max", "xi", "rho"):
        torch.testing.assert_close(red[f], getattr(single, f), rtol=0, atol=1e-12)
    assert torch.equal(red["tv_upper_a"].amax(1), single.tv_upper_a.amax(1))
    torch.testing.assert_close(torch.cat([r[1] for r in ranks], 1), o1, rtol=0, atol=0)


def test_record_write_in_chunks_matches_one_pass(monkeypatch):
    """The side buffers do not depend on RECORD_CHUNK (chunks bound the float64 memory)."""
    g = torch.Generator().manual_seed(7)
    size, H, D = 40, 2, 64
    k = torch.randn(size, H, D, generator=g).bfloat16()
    v = torch.randn(size, H, D, generator=g).bfloat16()
    loc = torch.randperm(size, generator=g)
    kb, vb = torch.zeros(size, H, D, dtype=torch.float8_e4m3fn), torch.zeros(size, H, D, dtype=torch.float8_e4m3fn)
    kb[loc], vb[loc] = (k.float() / 0.5).to(kb.dtype), (v.float() / 0.5).to(vb.dtype)
    sides = []
    for chunk in (1 << 18, 7):
        monkeypatch.setattr(ws, "RECORD_CHUNK", chunk)
        ws.STATE.layers.clear()
        s = ws.record_write(kb, vb, 0, loc, k, v, 0.5, 0.5, torch.float8_e4m3fn)
        sides.append([s.k_wit.clone(), s.v_wit.clone(), s.v_norm.clone(), s.k_norm.clone()])
    ws.STATE.layers.clear()
    for a, b in zip(*sides):
        assert torch.equal(a, b)
    assert float(sides[0][0].min()) > 0  # fp8 residuals: every key witness positive


# ---------------------------------------------------------------- trace / metrics export


def _decode_twice(pool, q, slots, indptr, ks):
    outs = []
    for _ in range(2):  # two decode calls of layer 0: steps 1 and 2
        outs.append(sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr, ks, ks))
    return outs


def test_trace_and_metrics_receive_state_records(tmp_path):
    from witcert.metrics import PrometheusMetrics
    from witcert.trace import Tee, Tracer, read_trace

    q, k, v, slots, indptr = scenario(2)
    mem, prom = Tracer(None), PrometheusMetrics()
    path = tmp_path / "sgl.trace.jsonl"
    ftr = Tracer(path)
    ftr.new_request("sglang-test")
    ws.install(force=True, targets=("decode",), bare=True, trace=Tee(mem, prom, ftr), flush_every=100)
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, 0.25, 0.25)
    outs = _decode_twice(pool, q, slots, indptr, 0.25)
    assert mem.rows_written == 0 and len(ws.STATE.pending) == 2  # still on the device: nothing synced yet
    recs = [r for _, r in ws.STATE.records]
    assert len(recs) == 2
    assert ws.flush() == 2 and not ws.STATE.pending
    Bsz = q.shape[0]
    t = mem.to_trace()
    assert len(t) == 2 * Bsz * HQ and mem.records_seen == 2
    exp = lambda f: torch.cat([getattr(r, f).reshape(-1) for r in recs]).numpy()  # noqa: E731
    assert (t["tv"] == exp("tv_upper_a")).all() and (t["tv_pre"] == exp("tv_upper_a")).all()
    assert (t["err"] == exp("out_err_upper")).all() and (t["eps_max"] == exp("eps_max")).all()
    assert (t["tv_tanh"] == exp("tanh")).all() and (t["tv_tilt"] == exp("tilt")).all()
    assert list(t["step"]) == [1] * (Bsz * HQ) + [2] * (Bsz * HQ)
    assert (t["layer"] == 0).all() and list(t["seq"][: Bsz * HQ]) == [b for b in range(Bsz) for _ in range(HQ)]
    assert list(t["head"][:HQ]) == list(range(HQ)) and list(t["kv_head"][:HQ]) == [h // GQ for h in range(HQ)]
    assert set(t["scheme"]) == {"sglang:fp8_e4m3"} and set(t["tier"]) == {"A"} and set(t["gate"]) == {None}
    assert not t["nan"].any() and not t["budget_spent"].any() and (t["blocks"] == 0).all()
    assert prom.value("witcert_rows_total", layer="0") == 2 * Bsz * HQ
    assert prom.value("witcert_tv_upper_count", layer="0", tier="A") == 2 * Bsz * HQ
    assert prom.value("witcert_rows_certified_total", layer="0") == float((exp("tv_upper_a") <= 0.1).sum())
    ws.uninstall()
    ftr.close()
    ft = read_trace(path)
    assert len(ft) == 2 * Bsz * HQ and set(ft["req"]) == {"sglang-test"}
    assert (ft["tv"] == exp("tv_upper_a")).all()
    # tracing changes nothing served: the same decode without a trace is bit-identical
    ws.install(force=True, targets=("decode",), bare=True)
    pool2 = _metered_pool(torch.float8_e4m3fn)
    fill(pool2, k, v, slots, 0.25, 0.25)
    o2, lse2 = sglang_decode(SGL.decode_attention_fwd, q, pool2, slots, indptr, 0.25, 0.25)
    assert torch.equal(o2, outs[0][0]) and torch.equal(lse2, outs[0][1])
    assert torch.equal(ws.STATE.records[-1][1].tv_upper_a, recs[0].tv_upper_a)


def test_trace_flush_every_and_install_checks():
    from witcert.trace import Tracer

    mem = Tracer(None)
    ws.install(force=True, targets=("decode",), bare=True, trace=mem, flush_every=1)
    q, k, v, slots, indptr = scenario(2)
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, 0.25, 0.25)
    sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr, 0.25, 0.25)
    assert mem.rows_written == q.shape[0] * HQ and not ws.STATE.pending
    ws.uninstall()
    with pytest.raises(ValueError, match="trace"):
        ws.install(force=True, targets=("decode",), bare=True, trace=object())
    with pytest.raises(ValueError, match="flush_every"):
        ws.install(force=True, targets=("decode",), bare=True, trace=mem, flush_every=0)
    assert not ws.installed()


# ---------------------------------------------------------------- the gate


class _FakeStore:
    """The exact K/V by SGLang slot (what the test handed the pool), counting page-ins."""

    def __init__(self, k, v, slots, corrupt=0.0):
        self.pos = torch.full((SIZE,), -1, dtype=torch.long)
        self.pos[slots] = torch.arange(slots.numel())
        self.k, self.v, self.corrupt, self.calls = k, v, corrupt, []

    def __call__(self, layer_id, s):
        self.calls.append(s.tolist())
        p = self.pos[s.long()]
        assert (p >= 0).all()
        return self.k[p] + self.corrupt, self.v[p]


def exact_attention(q, k, v, slots, indptr):
    o = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        sl = slice(int(indptr[b]), int(indptr[b + 1]))
        for hq in range(HQ):
            s_ = k[sl, hq // GQ].double() @ q[b, hq].double() / math.sqrt(D)
            o[b, hq] = torch.softmax(s_, 0) @ v[sl, hq // GQ].double()
    return o


def _run_fp8(seed=2, **kw):
    q, k, v, slots, indptr = scenario(seed)
    ws.install(force=True, targets=("decode",), bare=True, **kw)
    pool = _metered_pool(torch.float8_e4m3fn)
    fill(pool, k, v, slots, 0.25, 0.25)
    side = [t.clone() for t in (next(iter(ws.STATE.layers.values())).k_wit, next(iter(ws.STATE.layers.values())).v_wit)]
    o, lse = sglang_decode(SGL.decode_attention_fwd, q, pool, slots, indptr, 0.25, 0.25)
    rec = ws.STATE.records[-1][1]
    report = ws.STATE.gate_log[-1] if ws.STATE.gate_log else None
    after = [next(iter(ws.STATE.layers.values())).k_wit.clone(), next(iter(ws.STATE.layers.values())).v_wit.clone()]
    ws.uninstall()
    return dict(q=q, k=k, v=v, slots=slots, indptr=indptr, o=o, lse=lse, rec=rec, report=report, pool=pool,
                side=side, side_after=after)


def _check_gated_row_sound(r, row):
    """The returned record bounds the realised error of what was served for a repaired row:
    the overlay's values (exact at paged-in tokens, k̂ elsewhere), in fp64."""
    ov, slots, offs, lens, rows = r["report"].overlay
    i = rows.index(row)
    a, n = offs[i], lens[i]
    sl = slice(int(r["indptr"][row]), int(r["indptr"][row + 1]))
    for hq in range(HQ):
        h = hq // GQ
        qq = r["q"][row, hq].double()
        kh, vh = ov.k_codes[a : a + n, h, 0].double(), ov.v_codes[a : a + n, h, 0].double()
        kx, vx = r["k"][sl, h].double(), r["v"][sl, h].double()
        assert torch.all(ov.k_wit[a : a + n, h, 0, 0].double() >= (kh - kx).norm(dim=-1))
        assert torch.all(ov.v_wit[a : a + n, h, 0].double() >= (vh - vx).norm(dim=-1))
        p_hat = torch.softmax(kh @ qq / math.sqrt(D), 0)
        p = torch.softmax(kx @ qq / math.sqrt(D), 0)
        assert B.tv(p, p_hat).item() <= r["rec"].tv_upper_a[row, hq].item()
        assert ((p_hat @ vh) - (p @ vx)).norm().item() <= r["rec"].out_err_upper[row, hq].item()


@pytest.mark.parametrize("policy,tau", [("risk-ranked", 0.3), ("certified", 0.25)])
def test_gate_pages_in_rows_over_tau(policy, tau):
    from witcert.gate import Gate

    base = _run_fp8()
    store = _FakeStore(base["k"], base["v"], base["slots"])
    g = _run_fp8(gate=Gate(policy, tau=tau, max_pagein_blocks=4), exact_store=store)
    rep, pre, post = g["report"], base["rec"], g["rec"]
    over = (pre.tv_upper_a > tau).any(-1)
    assert rep.rows == torch.nonzero(over).flatten().tolist() and rep.rows and store.calls
    assert torch.equal(rep.tv_pre, pre.tv_upper_a)
    assert rep.repaired_rows and rep.pagein.sum() == len(rep.paged) <= 4 * HKV * len(rep.rows)
    assert (rep.pagein <= 4).all() and rep.rejected == 0
    o_exact = exact_attention(base["q"], base["k"], base["v"], base["slots"], base["indptr"])
    ov, slots, offs, lens, rows = rep.overlay
    for row in rep.repaired_rows:
        # the repaired row's bound drops, on every kv head that paged in
        for h in range(HKV):
            hs = slice(h * GQ, (h + 1) * GQ)
            if rep.pagein[row, h]:
                assert post.tv_upper_a[row, hs].max() < pre.tv_upper_a[row, hs].max()
        # served output closer to exact attention
        e_pre = (base["o"][row].double() - o_exact[row]).norm()
        e_post = (g["o"][row].double() - o_exact[row]).norm()
        assert e_post < e_pre
        _check_gated_row_sound(g, row)
    # the paged-in (slot, kv head) pairs are exact in the overlay: witnesses 0
    i_of = {(rows[i], t): offs[i] + t for i in range(len(rows)) for t in range(lens[i])}
    for row, h, slot, nbytes in rep.paged:
        t = (slots[offs[rows.index(row)] : offs[rows.index(row)] + lens[rows.index(row)]] == slot).nonzero().item()
        idx = i_of[(row, t)]
        assert float(ov.k_wit[idx, h].max()) == 0 and float(ov.v_wit[idx, h].max()) == 0
        assert nbytes == 2 * D * 2  # bf16 K + V of one slot, one kv head
    # rows not repaired: bit-identical output and record
    for row in range(base["q"].shape[0]):
        if row not in rep.repaired_rows:
            assert torch.equal(g["o"][row], base["o"][row]) and torch.equal(post.tv_upper_a[row], pre.tv_upper_a[row])
    # SGLang's fp8 buffers and the side witnesses are not written (the fp8 code cannot hold the exact value)
    assert torch.equal(g["pool"].k_buffer[0].view(torch.uint8), base["pool"].k_buffer[0].view(torch.uint8))
    assert all(torch.equal(a, b) for a, b in zip(g["side"], g["side_after"]))
    if policy == "certified":
        assert ((post.tv_upper_a <= tau) | torch.from_numpy(rep.budget_spent)).all()


def test_gate_under_tau_does_nothing():
    from witcert.gate import Gate

    base = _run_fp8()
    store = _FakeStore(base["k"], base["v"], base["slots"])
    tau = float(base["rec"].tv_upper_a.max()) + 0.05
    g = _run_fp8(gate=Gate("certified", tau=tau), exact_store=store)
    assert not store.calls and g["report"] is None
    assert torch.equal(g["o"], base["o"]) and torch.equal(g["lse"], base["lse"])
    assert torch.equal(g["rec"].tv_upper_a, base["rec"].tv_upper_a)


def test_gate_refuses_inconsistent_store():
    """A store whose K is not the slot's exact K (stale, wrong key) is refused: nothing paged in."""
    from witcert.gate import Gate

    base = _run_fp8()
    store = _FakeStore(base["k"], base["v"], base["slots"], corrupt=1.0)
    g = _run_fp8(gate=Gate("risk-ranked", tau=0.3, max_pagein_blocks=2), exact_store=store)
    assert store.calls and g["report"].rejected > 0 and not g["report"].paged
    assert torch.equal(g["o"], base["o"]) and torch.equal(g["rec"].tv_upper_a, base["rec"].tv_upper_a)
    assert ws.STATE.gate_rejected["store value farther from the stored one than its witness"] > 0


def test_host_exact_store_fed_by_the_write_and_traced():
    from witcert.gate import Gate
    from witcert.trace import Tracer

    base = _run_fp8()
    fake = _run_fp8(gate=Gate("risk-ranked", tau=0.3, max_pagein_blocks=4),
                    exact_store=_FakeStore(base["k"], base["v"], base["slots"]))
    mem = Tracer(None)
    host = ws.HostExactStore()
    g = _run_fp8(gate=Gate("risk-ranked", tau=0.3, max_pagein_blocks=4), exact_store=host, trace=mem)
    assert torch.equal(host.k[0][base["slots"]], base["k"])  # the wrapped write kept the exact K
    assert torch.equal(g["o"], fake["o"]) and torch.equal(g["rec"].tv_upper_a, fake["rec"].tv_upper_a)
    t = mem.to_trace()  # uninstall() flushed
    rep = g["report"]
    assert (t["tv"] == g["rec"].tv_upper_a.reshape(-1).numpy()).all()
    assert (t["tv_pre"] == base["rec"].tv_upper_a.reshape(-1).numpy()).all()
    assert set(t["gate"]) == {"risk-ranked@0.3"}
    blocks = rep.pagein[:, t["kv_head"][:HQ]].reshape(-1)
    assert (t["blocks"] == blocks).all() and (t["bytes"] == blocks * 2 * D * 2).all()


def test_gate_install_checks():
    from witcert.gate import Gate

    with pytest.raises(ValueError, match="exact_store"):
        ws.install(force=True, targets=("decode",), bare=True, gate=Gate("risk-ranked", tau=0.3))
    with pytest.raises(ValueError, match="scheme='sglang'"):
        ws.install(force=True, targets=("decode",), bare=True, scheme="int8", gate=Gate(), exact_store=lambda *a: a)
    with pytest.raises(ValueError, match="only used with a gate"):
        ws.install(force=True, targets=("decode",), bare=True, exact_store=lambda *a: a)
    assert not ws.installed()


def test_failing_store_or_gate_serves_the_first_pass(monkeypatch):
    """A store that raises refuses the page-in; a gate that raises serves the ungated pass,
    flagged under a certified gate (never a half-written row)."""
    from witcert.gate import Gate

    base = _run_fp8()

    def broken(layer_id, s):
        raise KeyError("slot not in store")

    g = _run_fp8(gate=Gate("risk-ranked", tau=0.3, max_pagein_blocks=2), exact_store=broken)
    assert g["report"].rejected > 0 and not g["report"].paged and torch.equal(g["o"], base["o"])
    from witcert.integrations import sglang_gate

    monkeypatch.setattr(sglang_gate, "_overlay", lambda *a: 1 / 0)
    g = _run_fp8(gate=Gate("certified", tau=0.3), exact_store=_FakeStore(base["k"], base["v"], base["slots"]))
    assert torch.equal(g["o"], base["o"]) and torch.equal(g["rec"].tv_upper_a, base["rec"].tv_upper_a)
    assert any(k.startswith("gate: ZeroDivisionError") for k in ws.STATE.unmetered)
    assert (g["report"].budget_spent == (base["rec"].tv_upper_a > 0.3).numpy()).all() and g["report"].budget_spent.any()
