"""Realised errors of real quantized keys/values never exceed the bounds (SPEC §1–§4, §7).

For every built-in scheme (and a user-registered one), random and outlier-channel keys, RoPE
applied before and after quantization: |δ_j| ≤ ε_j for every token, realised TV ≤ each §3
bound, and the realised output error ≤ the §4 bound.
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from witcert import bounds as B
from witcert import schemes as S

SCHEMES = ["none", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int8", "int8_dither", "int4_group", "kivi2"]


def softmax64(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def make_kv(rng, H, n, d, outliers, scale):
    k = rng.standard_normal((H, n, d)) * scale
    v = rng.standard_normal((H, n, d))
    if outliers:
        ch = rng.choice(d, max(1, d // 16), replace=False)
        k[..., ch] *= 25.0  # outlier key channels, as in real models
    return k, v


def check_all(q, k, k_hat, v, v_hat, sigma, groups, block_size, rope_pos=None, layout="half"):
    """Meter one decode step in fp64 and compare against realised errors."""
    n = k.shape[-2]
    W = B.key_witness(k, k_hat, groups, block_size)
    eps = B.logit_radius(q, W, groups, sigma, block_size, n)
    r = k_hat - k
    if rope_pos is not None:  # keys were quantized before RoPE; serve rotated keys
        k = B.rope(k, rope_pos, layout=layout)
        r = B.rope(r, rope_pos, layout=layout)  # RoPE is linear: rope(k̂) − rope(k) = rope(r)
        k_hat = k + r
    s = sigma * np.einsum("hd,hnd->hn", q, k)
    delta = sigma * np.einsum("hd,hnd->hn", q, r)  # δ_j = σ⟨q, r_j⟩ (SPEC §0)
    s_hat = s + delta
    assert np.all(np.abs(delta) <= eps), f"|δ| exceeds ε by {np.max(np.abs(delta) - eps)}"
    p, p_hat = softmax64(s), softmax64(s_hat)
    real_tv = B.tv(p, p_hat)
    bounds = {
        "tanh": B.tv_bound_tanh(eps),
        "eform": B.tv_bound_eform(p_hat, eps),
        "tilt": B.tv_bound_tilt(p_hat, eps),
        "tilt_levels": B.tv_bound_tilt(p_hat, eps, levels=np.geomspace(1e-4, 8.0, 24)),
    }
    for name, b in bounds.items():
        assert np.all(real_tv <= b), f"realised TV {real_tv} > {name} bound {b}"
    tvu = np.minimum.reduce(list(bounds.values()))
    phi = B.value_witness(v, v_hat, block_size)
    phi_tok = np.repeat(phi, block_size, axis=-1)[..., :n]
    o = np.einsum("hn,hnd->hd", p, v)
    o_hat = np.einsum("hn,hnd->hd", p_hat, v_hat)
    real_out = np.linalg.norm(o_hat - o, axis=-1)
    out_b = B.output_error_bound(p_hat, v_hat, phi_tok, tvu)
    assert np.all(real_out <= out_b), f"output error {real_out} > bound {out_b}"
    return real_tv, tvu


@given(
    st.sampled_from(SCHEMES),
    st.sampled_from([16, 64]),
    st.integers(1, 70),
    st.sampled_from([1, 4]),
    st.sampled_from([1, 2, 8]),
    st.booleans(),
    st.sampled_from(["none", "before", "after"]),
    st.sampled_from([0.3, 1.0, 4.0]),
    st.integers(0, 2**31),
)
def test_realised_errors_within_bounds(scheme, d, n, block_size, G, outliers, rope_mode, kscale, seed):
    rng = np.random.default_rng(seed)
    H = 2
    k, v = make_kv(rng, H, n, d, outliers, kscale)
    q = rng.standard_normal((H, d)) * 2.0
    pos = rng.integers(0, 50_000, n).astype(np.float64)
    groups = B.group_slices(d, min(G, d // 2))
    sigma = 1.0 / np.sqrt(d)
    if rope_mode == "before":  # the cache stores post-RoPE keys
        k = B.rope(k, pos)
    ctx_k = S.QuantContext(role="key", seed=seed % 1000, layer=3, positions=pos.astype(np.int64))
    ctx_v = S.QuantContext(role="value", seed=seed % 1000, layer=3, positions=pos.astype(np.int64))
    k_hat = S.quantize(scheme, torch.from_numpy(k).float(), ctx_k)[0].double().numpy()
    v_hat = S.quantize(scheme, torch.from_numpy(v).float(), ctx_v)[0].double().numpy()
    # the exact store is what the model produced in its dtype (fp32 here)
    k = k.astype(np.float32).astype(np.float64)
    v = v.astype(np.float32).astype(np.float64)
    check_all(q, k, k_hat, v, v_hat, sigma, groups, block_size, rope_pos=pos if rope_mode == "after" else None)


def test_user_registered_scheme_gets_the_same_machinery():
    def int6(x):  # a user scheme: symmetric 6-bit, per token
        s = x.abs().amax(-1, keepdim=True) / 31
        return torch.round(x / torch.where(s > 0, s, 1)) * s, {"scale": s}

    S.register_scheme("user_int6", int6, overwrite=True)
    assert "user_int6" in S.available_schemes()
    rng = np.random.default_rng(0)
    k, v = make_kv(rng, 2, 50, 64, True, 1.0)
    q = rng.standard_normal((2, 64))
    kh = S.quantize("user_int6", torch.from_numpy(k).float())[0].double().numpy()
    vh = S.quantize("user_int6", torch.from_numpy(v).float())[0].double().numpy()
    k, v = k.astype(np.float32).astype(np.float64), v.astype(np.float32).astype(np.float64)
    real, bound = check_all(q, k, kh, v, vh, 0.125, B.group_slices(64, 4), 1)
    assert np.all(real > 0) and np.all(bound < 1)  # a real, non-trivial check


def test_raw_fp8_overflow_is_metered_not_hidden():
    # keys beyond the fp8 range are saturated by the raw casts (contract.schemes code_max, on every torch: 2.13's own
    # e4m3fn cast saturates, 2.11's gives NaN, e5m2's ±inf): the witness sees the clipped residual
    x = torch.tensor([[[1000.0, 1.0, 0.0, 0.0]]])
    xh, meta = S.quantize("fp8_e4m3", x)
    assert xh[0, 0, 0].item() == 448.0 and meta["codes"].dtype == torch.float8_e4m3fn
    W = B.key_witness(x.double(), xh.double(), B.group_slices(4, 1), 1)
    assert float(W.max()) >= 552.0
    xh5, _ = S.quantize("fp8_e5m2", torch.tensor([[[1e6, -1e6, float("inf"), float("nan")]]]))
    assert xh5[0, 0, :2].tolist() == [57344.0, -57344.0] and xh5[0, 0, 2].item() == 57344.0
    assert torch.isnan(xh5[0, 0, 3])
    x5 = torch.tensor([[[1e6, 1.0]]])
    W5 = B.key_witness(x5.double(), S.quantize("fp8_e5m2", x5)[0].double(), B.group_slices(2, 1), 1)
    assert float(W5.max()) >= 1e6 - 57344
    # the bound saturates on such a radius
    eps = B.logit_radius(torch.ones(1, 2, dtype=torch.float64), W5, B.group_slices(2, 1), 0.5, 1)
    assert B.tv_bound(torch.tensor([[1.0]]), eps).item() <= 1.0
    assert B.tv_bound(torch.tensor([[0.5, 0.5]]), torch.cat([eps, eps], -1)).item() == 1.0


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown quantization scheme 'int3'"):
        S.get_scheme("int3")
    with pytest.raises(ValueError, match="exists"):
        S.register_scheme("int8", lambda x: (x, {}))
    with pytest.raises(ValueError, match="callable"):
        S.register_scheme("foo", 3)
    S.register_scheme("bad_shape", lambda x: (x[..., :1], {}), overwrite=True)
    with pytest.raises(ValueError, match="shape"):
        S.quantize("bad_shape", torch.randn(2, 4))
    with pytest.raises(ValueError, match="floating"):
        S.quantize("int8", torch.ones(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="role"):
        S.QuantContext(role="query")


def test_int8_dither_is_regenerable_and_exact():
    x = torch.randn(3, 20, 64) * 3
    ctx = S.QuantContext(seed=7, layer=2)
    xh, meta = S.quantize("int8_dither", x, ctx)
    # read side: codes + scale + regenerated dither reproduce x̂ bit for bit
    kvh = torch.arange(3).view(3, 1, 1)
    u = S.dither_u(7, 2, kvh, torch.arange(20).view(1, 20, 1), torch.arange(64), 0)
    again = meta["scale"][..., None] * (meta["codes"].float() - u)
    assert torch.equal(again, xh)
    assert meta["codes"].abs().max() <= 127
    # codes are floor(x/s + u + 1/2) computed exactly (fp64 check of the fp32 threshold trick)
    y = (x / meta["scale"][..., None]).double()
    c_exact = torch.floor(y + u.double() + 0.5)
    assert torch.equal(c_exact.to(torch.int8), meta["codes"])
    # residual / scale within (−1/2, 1/2] up to the documented bias
    r = (xh.double() - x.double()) / meta["scale"][..., None].double()
    assert r.abs().max() <= 0.5 + B.DITHER_BIAS_FACTOR
    # different layer / seed / stream give different dither
    assert not torch.equal(S.dither_u(7, 3, 0, 0, torch.arange(64), 0), S.dither_u(7, 2, 0, 0, torch.arange(64), 0))
    assert not torch.equal(S.dither_u(7, 2, 0, 0, torch.arange(64), 1), S.dither_u(7, 2, 0, 0, torch.arange(64), 0))


def test_dither_grid_is_uniform_and_centred():
    u = S.dither_u(1, 0, 0, torch.arange(4096).view(-1, 1), torch.arange(64), 0).double()
    assert u.min() > -0.5 and u.max() < 0.5
    # mean 0 and variance 1/12 of U(-1/2, 1/2) within 6 standard errors
    N = u.numel()
    assert abs(u.mean().item()) < 6 * (1 / 12) ** 0.5 / N**0.5
    assert abs(u.var().item() - 1 / 12) < 6 * (1 / 180) ** 0.5 / N**0.5
    # the bits used are exact multiples of 2^-24
    k = (u + 0.5) * 2**24
    assert torch.equal(k, torch.round(k)) and torch.all(k.remainder(2) == 1)


def test_hash_matches_uint32_reference():
    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        x ^= x >> 16
        return x

    def ref(seed, layer, kvh, pos, ch, stream):
        h = mix(seed ^ 0x9E3779B9)
        for f in (layer, kvh, pos, stream):
            h = mix(h ^ f)
        return mix(h ^ ((ch * 0x9E3779B9) & 0xFFFFFFFF))

    for fields in [(0, 0, 0, 0, 0, 0), (7, 29, 2, 131071, 63, 1), (2**32 - 1, 1, 1, 1, 255, 0)]:
        assert int(S.dither_hash(*fields)) == ref(*fields)


def test_round_up_to_dtype_never_rounds_down():
    x = torch.rand(10000, dtype=torch.float64) * torch.logspace(-6, 2, 10000, dtype=torch.float64)
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        y = S.round_up_to_dtype(x, dt)
        assert y.dtype == dt
        assert torch.all(y.to(torch.float64) >= x), dt
    assert torch.isnan(S.round_up_to_dtype(torch.tensor([500.0]), torch.float8_e4m3fn).float()).all()
    with pytest.raises(ValueError):
        S.round_up_to_dtype(torch.tensor([-1.0]), torch.float16)
