"""SPEC §3: every TV bound is >= the exact supremum (brute force), and the tilt bound is tight.

The brute force ``tv_sup_bruteforce`` is itself checked against a direct search over the
corners of the radius box (the supremum of a tilt over a box is reached at a corner).
"""

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.helpers.corners import corner_sup
from witcert import bounds as B

TOL = B.TILT_DEFAULT_TOL
#: rounding error of the fp64 brute force itself (sums of <= 16 terms of size <= 1): the
#: bounds must be >= the exact supremum, which is >= the brute-force value minus this.
BF_ERR = 1e-14


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@st.composite
def instances(draw, nmax=12):
    n = draw(st.integers(1, nmax))
    conc = draw(st.sampled_from([0.05, 0.3, 1.0, 5.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    logits = rng.standard_t(3, n) * draw(st.sampled_from([0.5, 2.0, 6.0]))
    p = softmax(logits) if draw(st.booleans()) else rng.dirichlet(np.full(n, conc))
    kind = draw(st.sampled_from(["random", "equal", "huge_on_tiny", "aligned", "zeros", "mixed_zero"]))
    scale = draw(st.sampled_from([1e-3, 0.05, 0.3, 1.0, 3.0]))
    if kind == "random":
        eps = rng.exponential(scale, n)
    elif kind == "equal":
        eps = np.full(n, scale)
    elif kind == "huge_on_tiny":
        eps = rng.exponential(scale * 0.1, n)
        j = int(np.argmin(p))
        eps[j] = scale * 20
    elif kind == "aligned":  # radii ordered like the logits
        eps = np.sort(rng.exponential(scale, n))[np.argsort(np.argsort(p))]
    elif kind == "zeros":
        eps = np.zeros(n)
    else:
        eps = rng.exponential(scale, n) * (rng.random(n) < 0.5)
    return p, eps


def test_bruteforce_matches_corner_search():
    rng = np.random.default_rng(1)
    for _ in range(60):
        n = int(rng.integers(1, 8))
        p = rng.dirichlet(np.ones(n) * 0.5)
        eps = rng.exponential(0.7, n)
        assert abs(B.tv_sup_bruteforce(p, eps) - corner_sup(p, eps)) < 1e-12


@given(instances())
def test_every_bound_at_least_exact_supremum(inst):
    p, eps = inst
    sup = B.tv_sup_bruteforce(p, eps)
    for name, val in [
        ("tanh", B.tv_bound_tanh(eps)),
        ("eform", B.tv_bound_eform(p, eps)),
        ("tilt", B.tv_bound_tilt(p, eps)),
        ("tilt_coarse", B.tv_bound_tilt(p, eps, tol=0.25)),
        ("tilt_levels", B.tv_bound_tilt(p, eps, levels=np.geomspace(1e-3, 4.0, 16))),
        ("min", B.tv_bound(p, eps)),
    ]:
        assert val >= sup - BF_ERR, f"{name} = {val} < exact supremum {sup}"
        assert 0.0 <= val <= 1.0


@given(instances())
def test_tilt_never_looser_than_tanh_or_eform(inst):
    p, eps = inst
    tilt = B.tv_bound_tilt(p, eps)
    assert tilt <= min(B.tv_bound_tanh(eps), B.tv_bound_eform(p, eps)) + TOL + 1e-12


@given(st.integers(1, 40), st.floats(1e-4, 4.0), st.integers(0, 2**31))
def test_tilt_equal_radii_is_tanh_half(n, e, seed):
    p = np.random.default_rng(seed).dirichlet(np.ones(n))
    assume(n >= 2)
    tilt = B.tv_bound_tilt(p, np.full(n, e))
    # the fractional supremum with equal radii is exactly tanh(ε/2)
    assert abs(tilt - math.tanh(e / 2)) <= TOL + 1e-12


@pytest.mark.parametrize("e", [0.01, 0.1, 0.5, 2.0])
def test_tanh_is_sharp(e):
    # many equal small masses: subsets can hit t_S = 1/2 closely, so the discrete supremum
    # approaches tanh(ε/2); the gap is bounded by the granularity of subset masses.
    n = 16
    p = np.full(n, 1.0 / n)
    sup = B.tv_sup_bruteforce(p, np.full(n, e))
    tanh = math.tanh(e / 2)
    # with mass 1/n per token the best subset mass is within 1/n of the optimum, and the
    # supremum's slope in the subset mass is at most 1 + e^{2ε}: a loose, honest margin.
    assert sup <= tanh + 1e-12
    assert sup >= tanh - (1.0 / n) * (1 + math.exp(2 * e)) / 2


def test_tilt_is_much_tighter_than_eform_on_peaked_attention():
    rng = np.random.default_rng(5)
    n = 2048
    logits = rng.standard_t(2, n) * 3
    logits[:3] += 12  # sink tokens
    p = softmax(logits)
    eps = rng.exponential(0.05, n)
    eps[rng.choice(n, 20)] = 3.0  # a few bad tokens
    tilt = B.tv_bound_tilt(p, eps)
    assert tilt < 0.5 * B.tv_bound_eform(p, eps)
    assert tilt < 0.5 * B.tv_bound_tanh(eps)


def test_levels_round_up_and_overflow_bin():
    lv = np.array([0.0, 0.1, 0.2])
    r = np.array([0.0, 0.05, 0.1, 0.15, 0.3, 0.25])
    out = B.round_levels(r, lv)
    np.testing.assert_array_equal(out, [0.0, 0.1, 0.1, 0.2, 0.3, 0.3])
    assert np.all(out >= r)


def test_masked_tokens_do_not_matter():
    p = np.array([0.5, 0.5, 0.0])
    eps = np.array([0.1, 0.1, 50.0])
    assert B.tv_bound(p, eps) == pytest.approx(math.tanh(0.05), abs=TOL)


def test_batched_rows_match_single_rows():
    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.ones(6), size=(2, 3))
    E = rng.exponential(0.4, (2, 3, 6))
    full = B.tv_bound(P, E)
    assert full.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert full[i, j] == B.tv_bound(P[i, j], E[i, j])
    # radius broadcasts over leading dims
    assert B.tv_bound_tilt(P, E[0, 0]).shape == (2, 3)


def test_nan_and_inf_saturate():
    p = np.array([0.5, 0.5])
    for bad_p, bad_e in [([np.nan, 0.5], [0.1, 0.1]), ([0.5, 0.5], [np.nan, 0.1]), ([0.5, 0.5], [np.inf, 0.0])]:
        for f in (B.tv_bound_eform, B.tv_bound_tilt, B.tv_bound):
            assert f(np.array(bad_p), np.array(bad_e)) == 1.0
    assert B.tv_bound_tanh(np.array([np.nan, 0.1])) == 1.0
    assert B.tv_bound(p, np.array([800.0, 800.0])) == 1.0  # e^ε overflows: saturated, not NaN
    assert B.tv_sup_bruteforce(p, np.array([np.nan, 0.0])) == 1.0


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: B.tv_bound(np.array([0.5, 0.6]), np.array([0.1, 0.1])), "p_hat"),
        (lambda: B.tv_bound(np.array([1.2, -0.2]), np.array([0.1, 0.1])), "p_hat"),
        (lambda: B.tv_bound(np.array([0.5, 0.5]), np.array([0.1, -0.1])), "radius"),
        (lambda: B.tv_bound(np.array([0.5, 0.5]), np.array([0.1, 0.1, 0.1])), "radius"),
        (lambda: B.tv_bound_tilt(np.array([1.0]), np.array([0.1]), tol=0.0), "tol"),
        (lambda: B.tv_bound_tilt(np.array([1.0]), np.array([0.1]), levels=[0.2, 0.1]), "levels"),
        (lambda: B.tv_sup_bruteforce(np.full(17, 1 / 17), np.zeros(17)), "n <= 16"),
        (lambda: B.tv(np.array([0.5, 0.5]), np.array([1.0])), "q"),
        (lambda: B.tv_bound_tanh(np.array([])), "radius"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    p = torch.softmax(torch.randn(4, 7, dtype=torch.bfloat16).float(), -1)
    e = torch.rand(4, 7, dtype=torch.float16)
    for f in (B.tv_bound, B.tv_bound_tilt, B.tv_bound_eform):
        out = f(p, e)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float64 and out.shape == (4,)
    out = B.tv_bound_tanh(e)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    assert isinstance(B.tv_bound(p.numpy(), e.numpy()), np.ndarray)


def test_tv_matches_definition_and_max_gain():
    rng = np.random.default_rng(2)
    for _ in range(20):
        n = int(rng.integers(1, 9))
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        masks = ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).astype(bool)
        max_gain = max(p[m].sum() - q[m].sum() for m in masks)
        assert B.tv(p, q) == pytest.approx(max_gain, abs=1e-12)  # SPEC tv_eq_max_gain
