"""The centred box's tilt on the fixed (t, λ) grid (SPEC §3(c), ``sketch_box="grid"``: ``dual_grid._tilt_row_grid``,
``tv_bound_parts_logits(grid=True)``): every grid bound is ≥ the exact supremum over the box (its corners), the λ = 0
cap and the saturations hold, the grid's multipliers are float32-exact, the fp64 slack is pinned, and on
sketch-like rows the grid stays close to the branch and bound's centred tilt.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS, check_grid, grid_sum_points
from tests.helpers.corners import box_instances
from witcert import bounds as B
from witcert.bounds import dual_grid as DG
from witcert.bounds.rounding import FP64_ABS_SLACK

BF_ERR = 1e-14
LEVELS = np.concatenate([[0.0], 2.0 ** (np.arange(-224, 65) / 16.0)])
PTS, LAMS = GRID_TILT_POINTS, GRID_TILT_LAMBDAS


def uniform(n: int, lams) -> tuple:
    """n equal intervals, each with the multipliers ``lams``: (points, per-interval multipliers)."""
    return tuple(np.arange(n + 1) / n), tuple(tuple(lams) for _ in range(n))




@settings(max_examples=300, deadline=None)
@given(box_instances())
def test_every_grid_bound_at_least_exact_supremum(inst):
    p, c, e = inst
    logits = np.log(p)
    sup_box = float(B.tv_sup_bruteforce(p, e, center=c))
    sup_sym = float(B.tv_sup_bruteforce(p, e))
    for x in (*B.tv_bound_parts_logits(logits, e, center=c, grid=True),
              *B.tv_bound_parts_logits(logits, e, center=c, levels=LEVELS, grid=True)):
        assert float(x) >= sup_box - BF_ERR
    for x in B.tv_bound_parts_logits(logits, e, grid=True):  # no centre: the symmetric box, unbinned
        assert float(x) >= sup_sym - BF_ERR
    w = p / p.sum()
    up, down = -c + e, -c - e
    assert DG._tilt_row_grid(w, up, down, PTS, LAMS) >= sup_box - BF_ERR


@settings(max_examples=100, deadline=None)
@given(box_instances(), st.integers(1, 12), st.lists(st.floats(0.0, 50.0), max_size=4))
def test_any_grid_and_any_multipliers_are_sound(inst, intervals, lams):
    """SPEC §3(c): any cover and any λ ≥ 0 (the kernel's constants are one choice among them)."""
    p, c, e = inst
    sup = float(B.tv_sup_bruteforce(p, e, center=c))
    assert DG._tilt_row_grid(p, -c + e, -c - e, *uniform(intervals, lams)) >= sup - BF_ERR


def test_the_cap_alone_is_the_largest_grid_point():
    """With no candidate the only multiplier is λ = 0, whose end value is t_{i+1}: the bound is 1."""
    p = np.array([0.5, 0.5])
    assert DG._tilt_row_grid(p, np.array([0.1, 0.0]), np.array([-0.1, 0.0]), *uniform(8, ())) == 1.0


def test_a_fine_grid_with_dense_multipliers_reaches_the_supremum():
    """The grid is loose only by its coarseness: refined (512 intervals) with dense multipliers it comes within a
    thousandth of the branch and bound's centred tilt (both bound the same fractional relaxation, which can sit above
    the exact supremum of a few tokens), and stays above the supremum."""
    rng = np.random.default_rng(4)
    lams = np.exp(np.linspace(-1.5, 1.5, 3001))
    for _ in range(12):
        n = int(rng.integers(2, 8))
        p = rng.dirichlet(np.ones(n))
        c, e = rng.normal(0, 0.2, n), rng.exponential(0.1, n)
        sup = float(B.tv_sup_bruteforce(p, e, center=c))
        box = float(B.tv_bound_tilt(p, e, center=c))
        fine = DG._tilt_row_grid(p, -c + e, -c - e, *uniform(512, lams))
        assert sup - BF_ERR <= fine and abs(fine - box) <= 1e-3


def test_wide_boxes_fall_back_to_the_cap_and_the_symmetric_tilt():
    """The kernel's candidates e^{±δ} suit boxes of a few per cent (the real rows); where a box is wide the tight λ
    (1 / max a at small t, 1 / min b near 1) lies outside them, the grid's value rises toward the cap t_{i+1}, and
    ``tv_bound_parts_logits(grid=True)`` keeps the symmetric tilt's value instead (the smaller is metered)."""
    eps = math.log(5.0 / 3.0)
    p, e = np.array([0.5, 0.5]), np.array([eps, 0.0])
    grid = DG._tilt_row_grid(p, e, -e, PTS, LAMS)
    sup = float(B.tv_sup_bruteforce(p, e))
    assert abs(sup - 0.125) < 1e-15 and grid >= 0.2
    metered = float(B.tv_bound_parts_logits(np.log(p), e, grid=True)[2])
    assert sup <= metered <= float(B.tv_bound_tilt(p, e)) + 1e-12


def test_the_fp64_slack_is_added(monkeypatch):
    """Pinned: the grid's value carries FP64_ABS_SLACK (dropping it lowers the value by exactly that)."""
    eps = math.log(5.0 / 3.0)
    p, up, down = np.array([0.5, 0.5]), np.array([eps, 0.0]), np.array([-eps, 0.0])
    with_slack = DG._tilt_row_grid(p, up, down, PTS, LAMS)
    monkeypatch.setattr(DG, "FP64_ABS_SLACK", 0.0)
    assert with_slack - DG._tilt_row_grid(p, up, down, PTS, LAMS) == FP64_ABS_SLACK


def test_the_dual_rounding_bound_is_subtracted(monkeypatch):
    """Pinned: each D's float error bound is subtracted (a D taken as computed gives a smaller value)."""
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(64))
    c, e = rng.normal(0, 0.2, 64), rng.exponential(0.05, 64)
    safe = DG._tilt_row_grid(p, -c + e, -c - e, PTS, LAMS)
    monkeypatch.setattr(DG, "_EPS64", 0.0)
    assert DG._tilt_row_grid(p, -c + e, -c - e, PTS, LAMS) < safe


@pytest.mark.parametrize("case", ["overflow", "underflow", "nan", "inverted"])
def test_saturations(case):
    p = np.array([0.5, 0.5])
    up, down = {"overflow": ([701.0, 0.0], [699.0, 0.0]), "underflow": ([0.0, -699.0], [0.0, -701.0]),
                "nan": ([np.nan, 0.0], [0.0, 0.0]), "inverted": ([0.0, 0.0], [0.1, 0.0])}[case]
    assert DG._tilt_row_grid(p, np.array(up), np.array(down), PTS, LAMS) == 1.0


def test_trivial_rows_are_zero():
    assert DG._tilt_row_grid(np.array([1.0]), np.array([0.3]), np.array([-0.3]), PTS, LAMS) == 0.0  # one token
    p = np.array([0.2, 0.3, 0.5])
    assert DG._tilt_row_grid(p, np.full(3, 0.4), np.full(3, 0.4), PTS, LAMS) == 0.0  # a common shift: p = p̂


def test_grid_follows_the_centred_tilt_at_the_real_rows_scale():
    """The point of the grid: unbinned and one pass, it stays within ~10 % of the branch and bound's centred tilt at
    the scale of SmolLM2's int8 rows (|c| ~ 0.03, ε ~ 0.07: medians over the ``witcert tightness`` rows), and never
    below it by more than the branch and bound's tolerance (both bound the same fractional relaxation)."""
    rng = np.random.default_rng(1)
    ratios = []
    for _ in range(8):
        n = 512
        s = rng.normal(0, 2.0, n)
        c, e = rng.normal(0, 0.03, n), rng.exponential(0.07, n)
        grid = float(B.tv_bound_logits(s, e, center=c, grid=True))
        box = float(B.tv_bound_logits(s, e, center=c))
        assert grid >= box - 2 * B.TILT_DEFAULT_TOL
        ratios.append(grid / box)
    assert float(np.median(ratios)) < 1.15


@pytest.mark.parametrize("lam", [1e5, 1e300])
def test_a_multiplier_whose_dual_overflows_tells_nothing(lam):
    """helper-39's reproducer: a large λ on a box shifted far from 0 overflows D to inf − inf (NaN); that candidate is
    ignored (its intervals keep the cap or another candidate), never read as 0."""
    p, up, down = np.array([0.5, 0.5]), np.array([0.5, 0.0]), np.array([-0.5, 0.0])
    sup = float(B.tv_sup_bruteforce(p, np.array([0.5, 0.0])))
    for shift in (0.0, 30.0, 699.0):
        assert DG._tilt_row_grid(p, up + shift, down + shift, *uniform(8, (lam,))) >= sup
        assert DG._tilt_row_grid(p, up + shift, down + shift, *uniform(8, (*LAMS[0], lam))) >= sup


@pytest.mark.parametrize("lams", [(float("nan"),), (float("inf"),), (-1.0,), (1.0, -1e-300)])
def test_bad_multipliers_are_refused(lams):
    with pytest.raises(ValueError, match="multipliers"):
        DG._tilt_row_grid(np.array([0.5, 0.5]), np.array([0.5, 0.0]), np.array([-0.5, 0.0]), *uniform(8, lams))


@pytest.mark.parametrize("points", [(), (0.0,), (0.0, 0.5), (0.1, 1.0), (0.0, 0.5, 0.5, 1.0), (0.0, 0.7, 0.3, 1.0),
                                    (0.0, float("nan"), 1.0), "ab"])
def test_bad_grid_points_are_refused(points):
    with pytest.raises(ValueError, match="grid"):
        DG._tilt_row_grid(np.array([0.5, 0.5]), np.array([0.5, 0.0]), np.array([-0.5, 0.0]), points, ((1.0,),) * 3)


def test_one_multiplier_tuple_per_interval():
    with pytest.raises(ValueError, match="one tuple per interval"):
        check_grid((0.0, 0.5, 1.0), ((1.0,),))
    with pytest.raises(ValueError, match="one tuple per interval"):
        check_grid((0.0, 0.5, 1.0), ((1.0,), (), ()))


@pytest.mark.parametrize("w", [[np.nan, 1.0], [np.inf, 1.0], [-0.5, 1.0]])
def test_bad_masses_saturate(w):
    """A non-finite or negative mass is not dropped silently: the row saturates (both box forms)."""
    up, down = np.array([0.5, 0.0]), np.array([-0.5, 0.0])
    assert DG._tilt_row_grid(np.array(w), up, down, PTS, LAMS) == 1.0
    assert DG._tilt_row_box(np.array(w), up, down, B.TILT_DEFAULT_TOL, 1 << 15) == 1.0


def test_the_contract_grid_is_valid_and_float32_exact():
    """The contract's grid passes its own check, every point and multiplier is exact in float32 (the kernel's tile,
    its merge and this reference use the same numbers), the first interval's multipliers are ≤ 1 and the last's ≥ 1
    (the tight λ's side on real rows), and the sums the kernel needs are the distinct (t, λ) ends."""
    ts, ls = check_grid(GRID_TILT_POINTS, GRID_TILT_LAMBDAS)
    for x in (*ts, *(v for r in ls for v in r)):
        assert float(np.float32(x)) == x
    assert max(ls[0]) <= 1.0 <= min(ls[-1]) and all(1.0 in r for r in ls)
    pts = grid_sum_points()
    want = {(t, lam) for i, r in enumerate(ls) for lam in r for t in (ts[i], ts[i + 1])}
    assert set(pts) == want and len(pts) == len(want) and (0.0, 1.0) in pts


def test_a_common_centre_shift_loosens_the_grid_but_not_the_metered_bound():
    """helper-39: the grid works on the unshifted box, so a centre common to every token (no error at all) makes its
    own value looser; the metered tilt is the smaller of it and the symmetric tilt at |c| + ε, so it never exceeds
    the latter, and stays ≥ the supremum."""
    s, e = np.array([0.0, 1.0, -1.0, 0.5]), np.full(4, 0.05)
    p = np.exp(s - s.max())
    p /= p.sum()
    sup = float(B.tv_sup_bruteforce(p, e))
    for shift in (0.0, 0.2, 1.0, 5.0):
        c = np.full(4, shift)
        tilt = float(B.tv_bound_parts_logits(s, e, center=c, grid=True)[2])
        assert sup - BF_ERR <= tilt <= float(B.tv_bound_parts_logits(s, np.abs(c) + e)[2]) + 1e-12


def test_one_interval_and_lambda_one_is_the_two_sum_closed_form():
    """The grid's smallest case (one interval, λ = 1) is max(Σ p̂ (a − 1)₊, Σ p̂ (1 − b)₊): t − D(t, 1) at t = 0 and 1
    (the kernels' cheapest unbinned form, bench/TIGHTNESS.md), ≥ the supremum; and more intervals with λ = 1 alone
    gain nothing beyond the caps t_{i+1} (t − D(t, 1) is convex in t: its maximum is at an end)."""
    rng = np.random.default_rng(8)
    for _ in range(50):
        n = int(rng.integers(2, 7))
        p = rng.dirichlet(np.ones(n))
        c, e = rng.normal(0, 0.1, n), rng.exponential(0.05, n)
        a, b = np.exp(-c + e), np.exp(-c - e)
        closed = max(float(np.dot(p, np.maximum(a - 1, 0))), float(np.dot(p, np.maximum(1 - b, 0))))
        one = DG._tilt_row_grid(p, -c + e, -c - e, *uniform(1, (1.0,)))
        assert abs(one - min(1.0, closed)) <= 1e-12
        assert one >= float(B.tv_sup_bruteforce(p, e, center=c)) - BF_ERR
        four = DG._tilt_row_grid(p, -c + e, -c - e, *uniform(4, (1.0,)))
        assert four <= one + 1e-12 and (four >= one - 1e-12 or four >= 0.25)
