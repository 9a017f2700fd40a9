"""SPEC §1: groups are unions of whole RoPE bands; group norms are invariant under RoPE."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from witcert import bounds as B


def rope_complex(x, pos, theta, layout, r):
    """Independent RoPE: rotate each band as a complex number."""
    x = np.array(x, dtype=np.float64)
    half = r // 2
    freqs = theta ** (-np.arange(half) * 2.0 / r)
    rot = np.exp(1j * pos[:, None] * freqs)
    if layout == "half":
        z = (x[..., :half] + 1j * x[..., half:r]) * rot
        x[..., :half], x[..., half:r] = z.real, z.imag
    else:
        z = (x[..., 0:r:2] + 1j * x[..., 1:r:2]) * rot
        x[..., 0:r:2], x[..., 1:r:2] = z.real, z.imag
    return x


dims = st.sampled_from([(64, None), (128, None), (64, 32), (80, 64), (6, 2), (2, 0)])


@given(dims, st.integers(1, 40), st.sampled_from(["half", "interleaved"]))
def test_groups_partition_whole_bands(dim, G, layout):
    d, r = dim
    rr = d if r is None else r
    nbands = rr // 2 + (d - rr)
    if G > nbands:
        with pytest.raises(ValueError, match="num_groups"):
            B.group_slices(d, G, r, layout)
        return
    gs = B.group_slices(d, G, r, layout)
    assert len(gs) == G
    assert np.array_equal(np.sort(np.concatenate(gs)), np.arange(d))
    half = rr // 2
    for g in gs:
        s = set(g.tolist())
        for c in s:
            if c < rr:  # the band partner of every rotary coordinate is in the same group
                partner = (c + half if c < half else c - half) if layout == "half" else c ^ 1
                assert partner in s


@given(dims, st.integers(1, 8), st.sampled_from(["half", "interleaved"]), st.integers(0, 2**31))
def test_band_unitarity(dim, G, layout, seed):
    d, r = dim
    rr = d if r is None else r
    G = min(G, rr // 2 + (d - rr))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 5, d)) * rng.exponential(1, d)
    pos = rng.integers(0, 200_000, 5).astype(np.float64)
    gs = B.group_slices(d, G, r, layout)
    y = B.rope(x, pos, theta=10000.0, layout=layout, rotary_dim=r)
    np.testing.assert_allclose(B.group_norms(y, gs), B.group_norms(x, gs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, rope_complex(x, pos, 10000.0, layout, rr), rtol=1e-10, atol=1e-10)


def test_rope_matches_hf_rotate_half():
    torch = pytest.importorskip("torch")
    d, n = 64, 9
    x = torch.randn(2, n, d, dtype=torch.float64)
    pos = torch.arange(n, dtype=torch.float64) * 37
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    ref = x * emb.cos() + rot * emb.sin()
    out = B.rope(x, pos)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_bad_inputs():
    with pytest.raises(ValueError, match="layout"):
        B.group_slices(64, 2, layout="neox")
    with pytest.raises(ValueError, match="rotary_dim"):
        B.group_slices(64, 2, rotary_dim=63)
    with pytest.raises(ValueError, match="head_dim"):
        B.group_slices(0, 1)
    with pytest.raises(ValueError, match="groups"):
        B.group_norms(np.ones(4), [np.array([0, 1])])
    with pytest.raises(ValueError, match="positions"):
        B.rope(np.ones((3, 4)), np.ones(5))
