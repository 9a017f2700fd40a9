"""The fp8 key dot in fp16 (``kernels.plan.KEY_F16_SCHEMES``, the decode's KEY_F16): on the GPU under a bf16 query an
e4m3 scheme's key codes go to fp16 in one conversion and meet the query scaled per head column by 2^e_h into fp16
(``decode_program._key_f16_query``), where the bf16 dot took a second conversion per code. Where the scaled query is
exact in fp16 the logits are the bf16 dot's, bit for bit; where it is not (a column's entries spanning more than
fp16's range below its largest) a metered program counts its rows non-finite: not metered, never silently wrong. The
library takes it for meter-off calls (``KEY_F16_METERED`` off: no gain metered, run F1); the tests below turn it on
for metered calls too, and for e5m2, to check the guard and the bit identity there.

* which calls take it (any device: the constexprs of a plan);
* the torch twin of the query's exactness (``key_f16_exact``) on the cases the kernel must agree with;
* on the GPU: the outputs and the record bit-identical to the bf16 dot's (every fp8 scheme, ordinary and extreme query
  scales), and a query that is not exact in fp16 flags its kv head's rows and no other."""

import dataclasses
import math
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu]
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

import kernels.decode as Dk  # noqa: E402
import kernels.plan as kp  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from tests.helpers.conformance import build, to_cpu  # noqa: E402

FP8 = ("fp8_e4m3", "fp8_e4m3_scaled", "fp8_e5m2")
FIELDS = ("tv_upper_a", "out_err_upper", "xi", "eps_max", "flag")
cuda_only = pytest.mark.skipif(DEV != "cuda", reason="KEY_F16 is the GPU's tensor-core path (LOWP)")


def key_f16_exact(q: torch.Tensor) -> torch.Tensor:
    """The torch twin of ``_key_f16_query``'s ``ok16`` per (sequence, kv head) for q [B, Hkv, GQ, D] (bf16 values):
    each head's largest |q| scaled by 2^e to [2^14, 2^15) (the scale clamped to 2^±126), e in [−96, 93], and every
    entry's fp16 value times 2^-e the entry again (the round trip: a check against the fp32 scaled query passes an
    entry that underflows to 0 there)."""
    q = q.float()
    amax = q.abs().amax(-1)  # [B, Hkv, GQ]
    e = torch.where(amax > 0, 14 - torch.floor(torch.log2(amax.clamp_min(2.0**-149))), torch.zeros_like(amax))
    ec = e.clamp(-126, 126)[..., None]
    q16 = (q * torch.exp2(ec)).half()
    ok = (q16.float() * torch.exp2(-ec) == q).all(-1) & (e >= -96) & (e <= 93)
    return ok.all(-1)


def _constants(scheme, qdtype=torch.bfloat16, lowp=True, has_rep=False, meter=False):
    cache = PagedKV.allocate(4, 2, 64, scheme=scheme, device="cpu")
    q = torch.zeros(1, 4, 64, dtype=qdtype)
    bt = torch.zeros(1, 2, dtype=torch.int32)
    plan = dataclasses.replace(kp.plan_call(cache, q, bt, meter=meter), lowp=lowp)
    return Dk._kernel_constants(cache, q, plan, False, has_rep, False)


def test_key_f16_is_taken_for_e4m3_meter_off_under_a_bf16_query_on_the_tensor_core_path(monkeypatch):
    for scheme in ("fp8_e4m3", "fp8_e4m3_scaled"):
        assert _constants(scheme)["KEY_F16"]
        assert not _constants(scheme, meter=True)["KEY_F16"]  # (metered: no gain, run F1)
        assert not _constants(scheme, qdtype=torch.float16)["KEY_F16"]  # (fp16 q: the codes go to fp16 already)
        assert not _constants(scheme, lowp=False)["KEY_F16"]  # the interpreter's fp32 dots
        assert not _constants(scheme, has_rep=True)["KEY_F16"]  # a repaired page's bf16 keys are not fp16
    for scheme in ("fp8_e5m2", "int8", "int8_dither", "int4_group", "kivi2", "none"):
        assert not _constants(scheme)["KEY_F16"]
    monkeypatch.setattr(kp, "KEY_F16_METERED", True)
    assert _constants("fp8_e4m3", meter=True)["KEY_F16"]


def test_twin_of_the_query_exactness():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 4, 64, generator=g).bfloat16()
    assert key_f16_exact(q).all()
    assert key_f16_exact(q * 2.0**60).all() and key_f16_exact(q * 2.0**-60).all()  # (the scale absorbs it)
    one = torch.zeros(1, 1, 1, 64)
    for amax, ok in ((2.0**-79, True), (2.0**-80, False), (2.0**110, True), (2.0**111, False), (2.0**-120, False)):
        one[..., 0] = amax  # e = 93 / 94 (a subnormal product sum possible), −96 / −97 (a sum past 2^128), 134
        assert key_f16_exact(one.bfloat16()).item() == ok, amax
    wide = q.clone()
    wide[1, 0, 2, 0], wide[1, 0, 2, 1] = 1.0, 2.0**-40  # one head's entries 2^40 apart: 2^-26 after scaling
    ok = key_f16_exact(wide.bfloat16())
    assert not ok[1, 0] and ok.sum() == ok.numel() - 1
    under = torch.zeros(1, 1, 1, 64)
    under[..., 0], under[..., 1] = 2.0**64, 2.0**-101  # 2^-151 after scaling: 0 in fp32 as in fp16 (review 2026-12-07)
    assert not key_f16_exact(under.bfloat16()).item()
    assert key_f16_exact(torch.zeros_like(q)).all()  # (an all-zero head: e 0, exact)


def _decode(cache, q, bt, lens, key_f16, monkeypatch, meter=True):
    monkeypatch.setattr(kp, "KEY_F16_SCHEMES", FP8 if key_f16 else ())
    monkeypatch.setattr(kp, "KEY_F16_METERED", True)
    return to_cpu(decode(cache, q.to(DEV), bt.to(DEV), torch.tensor(lens).to(DEV), num_splits=3, meter=meter))


@cuda_only
@pytest.mark.parametrize("scheme", FP8)
@pytest.mark.parametrize("scale", [1.0, 2.0**60, 2.0**-60])
def test_fp16_key_dot_is_the_bf16_dot_bit_for_bit(scheme, scale, monkeypatch):
    lens = [70, 300]
    cache, bt, _ = build(scheme, lens, 2, 128, seed=11, outliers=True)
    q = (torch.randn(2, 8, 128, generator=torch.Generator().manual_seed(3)) * scale).bfloat16()
    assert key_f16_exact(q.view(2, 2, 4, 128)).all()
    off = [_decode(cache, q, bt, lens, f, monkeypatch, meter=False) for f in (True, False)]
    assert torch.equal(off[0].o, off[1].o) and torch.equal(off[0].lse, off[1].lse)
    a = _decode(cache, q, bt, lens, True, monkeypatch)
    b = _decode(cache, q, bt, lens, False, monkeypatch)
    assert torch.equal(a.o, b.o) and torch.equal(a.lse, b.lse)
    for f in FIELDS:
        assert torch.equal(getattr(a.meter, f), getattr(b.meter, f)), f
    if scale == 1.0:
        assert not a.meter.flag.any()


@cuda_only
@pytest.mark.parametrize("scheme", FP8)
@pytest.mark.parametrize("pair", [(1.0, 2.0**-40), (2.0**64, 2.0**-101), (2.0**-86, 2.0**-124), (2.0**112, 1.0)],
                         ids=["wide", "underflow", "e100", "e-98"])
def test_a_query_not_exact_in_fp16_flags_its_kv_head(scheme, pair, monkeypatch):
    """A metered program (KEY_F16_METERED forced) whose query is not exact in fp16 at its scale, or whose scale leaves
    [−96, 93] (a subnormal or an overflowing product sum possible), flags its rows; the others stay metered."""
    lens = [70, 40]
    cache, bt, _ = build(scheme, lens, 2, 128, seed=12)
    q = torch.randn(2, 8, 128, generator=torch.Generator().manual_seed(4))
    q[0, 4:8] = 0.0
    q[0, 5, 0], q[0, 5, 1] = pair  # sequence 0, query head 5: kv head 1 (GQ 4)
    q = q.bfloat16()
    ok = key_f16_exact(q.view(2, 2, 4, 128))
    assert ok.tolist() == [[True, False], [True, True]]
    out = _decode(cache, q, bt, lens, True, monkeypatch)
    flag = out.meter.flag.view(2, 2, 4)
    assert flag[0, 1].all() and (out.meter.tv_upper_a.view(2, 2, 4)[0, 1] == 1.0).all()
    assert not flag[0, 0].any() and not flag[1].any()
    if pair[0] == 1.0:
        ref = _decode(cache, q, bt, lens, False, monkeypatch)  # the bf16 dot: exact, metered
        assert not ref.meter.flag.any()
        # the served output: the fp16 query's rounding moves a logit by ≤ 2^-39·max|q|·Σ|k|, far inside bf16's output
        # rounding (the row is flagged all the same)
        assert torch.allclose(out.o.float(), ref.o.float(), rtol=0, atol=2.0**-7 * ref.o.float().abs().max().item())
        assert math.isfinite(out.o.float().abs().max().item())


@cuda_only
@pytest.mark.parametrize("amax", [2.0**-120, 2.0**-100, 2.0**-60])
def test_meter_off_tiny_queries_serve_the_bf16_dots_output(amax, monkeypatch):
    """Meter off (the library's KEY_F16 calls), a query whose scale is clamped (2^-120: e 134 → 126) or out of ok16's
    range: its logits are within max(2^-39·max|q|, 2^-151)·Σ|k| of the bf16 dot's, so the served output is the same to
    bf16's rounding."""
    lens = [70, 40]
    cache, bt, _ = build("fp8_e4m3", lens, 2, 128, seed=13)
    q = torch.randn(2, 8, 128, generator=torch.Generator().manual_seed(6))
    q = (q / q.abs().amax(-1, keepdim=True) * amax).bfloat16()
    a = _decode(cache, q, bt, lens, True, monkeypatch, meter=False)
    b = _decode(cache, q, bt, lens, False, monkeypatch, meter=False)
    assert torch.isfinite(a.o).all()
    assert torch.allclose(a.o.float(), b.o.float(), rtol=2.0**-7, atol=2.0**-7 * b.o.float().abs().max().item())
