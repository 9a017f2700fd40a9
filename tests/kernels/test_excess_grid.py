"""The centred sketch box's small (t, λ) grid in the decode (``kernels.excess_grid``: the tile's sums, the merge's
``_grid_form`` and its torch twin ``grid_form_torch``; Lean ``tilt_tv_le_grid_rescaled``; bench/TIGHTNESS.md, "A small
grid in the fused merge").

* the form against the realised TV(p, p̂) over the centred box's corners and random points, with the kernel's mass
  error (p̂ ∝ p̃ e^ξ, |ξ| ≤ Ξ, adversarial signs), at the real rows' scale and at wide boxes;
* the form written out again here from the module doc (the formula is pinned, each slack with it), and a row where
  the measure change's term E·(…) is needed;
* its saturations; the fused merge against the torch merge with the grid block; the decode in the interpreter (the
  tile's sums, the window's a = b = 1 terms): its TV⁺ never above the decode's without the grid, and never below the
  realised TV of the fp64 served attention (the self-check, tests/cache/test_decode_selftest.py, holds it above the
  supremum of its own box)."""

import math
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]

from contract.constants import GRID_TILT_LAMBDAS, GRID_TILT_POINTS  # noqa: E402
from kernels import epilogue as E  # noqa: E402
from kernels import excess_grid as X  # noqa: E402
from kernels.decode import decode  # noqa: E402
from kernels.fp_bounds import dot_gamma, mass_eta_terms  # noqa: E402
from kernels.key_levels import KEY_LEVELS  # noqa: E402
from tests.helpers.merge_partials import synthetic_partials  # noqa: E402
from tests.helpers.sketch_case import fp64_sketch_case, sketch_cache, window_over  # noqa: E402
from witcert import bounds as B  # noqa: E402


def _tv(p, q):
    return float((p - q).clamp_min(0).sum())


def grid_sums(pt, c, eps):
    """(Â, the grid block / L [GRID_COLS]) of masses ``pt`` over the centred box c ± ε, float64 tensors (the tile's sums
    in exact arithmetic: ``excess_grid.grid_block_fp64``)."""
    a, g = X.grid_block_fp64(pt.numpy(), c.numpy(), eps.numpy())
    return torch.tensor(float(a), dtype=torch.float64), torch.from_numpy(g)


def _spec_form(a_hat, g, xi):
    """The module doc's form, written out again: G(t, λ) at both ends of each interval of the contract's cover."""
    gr = 1 + xi + 2.0**-21
    v = g[X.NG + 1] * gr
    err = (xi + 2.0**-21) * v
    m_lo, m_up = 1 + g[X.NG] - err, 1 + g[X.NG] + err
    y = 2 * xi
    e = (y + y * y / 2 + y**3 if y < 2.0**-10 else math.expm1(y)) * (1 + 2.0**-40)
    sums = {(0.0, 1.0): a_hat * gr, **{p: g[k] * gr for k, p in enumerate(X.GRID)}}

    def G(t, lam):
        s = sums[(t, lam)]
        return s - t * (lam * m_lo - 1) + e * (s + t * (v + abs(lam - 1) * m_up))

    ts = GRID_TILT_POINTS
    top = max(min([ts[i + 1]] + [max(G(ts[i], lam), G(ts[i + 1], lam)) for lam in row])
              for i, row in enumerate(GRID_TILT_LAMBDAS))
    return min(1.0, max(0.0, top) * (1 + 2.0**-40) + 2.0**-50)


def _form(pt, c, eps, xi):
    a, g = grid_sums(pt, c, eps)
    return float(X.grid_form_torch(a, g, torch.tensor(xi, dtype=torch.float64)))


def _worst_tv(pt, c, eps, xi_max, g, extra=()):
    """The largest TV(p, p̂) found: p̂ ∝ p̃ e^ξ for ξ of random signs and of the signs that favour each side (and
    ``extra``), and for each the exact supremum over the box (``bounds.tv_sup_bruteforce``: every subset, n ≤ 16)."""
    n = pt.numel()
    lo, hi = -c - eps, -c + eps
    pats = [torch.where(torch.rand(n, generator=g) < 0.5, 1.0, -1.0).double(), torch.where(hi > 0, 1.0, -1.0).double(),
            torch.where(lo < 0, 1.0, -1.0).double(), *extra]
    worst = 0.0
    for sgn in pats:
        ph = pt * torch.exp(sgn * xi_max)
        worst = max(worst, float(B.tv_sup_bruteforce((ph / ph.sum()).numpy(), eps.numpy(), center=c.numpy())))
    return worst


def _row(g, n, scale_c, scale_e):
    pt = torch.rand(n, generator=g, dtype=torch.float64) ** 4 + 1e-6
    c = torch.randn(n, generator=g, dtype=torch.float64) * scale_c
    eps = torch.rand(n, generator=g, dtype=torch.float64) * 2 * scale_e
    return pt, c, eps


@pytest.mark.parametrize("seed", range(16))
def test_the_grid_form_bounds_tv_over_the_box_and_the_mass_error(seed):
    """TV(p, p̂) ≤ the form (no tanh(Ξ/2): it bounds TV(p, p̂) itself) at the real rows' scale (|c| ~ 0.03, ε ~ 0.07,
    where the grid's multipliers act) and at wider boxes, for Ξ ∈ {0, 1e-6, 1e-3, 0.05}."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 15, (1,), generator=g))
    sc, se = ((0.03, 0.07), (0.003, 0.01), (0.3, 0.5), (2.0, 1.0))[seed % 4]
    pt, c, eps = _row(g, n, sc, se)
    xi = (0.0, 1e-6, 1e-3, 0.05)[(seed // 4) % 4]
    assert _worst_tv(pt, c, eps, xi, g) <= _form(pt, c, eps, xi)


def test_the_grid_is_tighter_than_the_two_sums_at_the_real_rows_scale():
    """The point of the grid: at the int8 rows' scale (many tokens, |c| ~ 0.03, ε ~ 0.07) its form is well below the
    two-sum excess form e^{2Ξ} max(Â, B̂) (median over rows < 0.93×), and never above it by more than the measure
    change (the merge keeps the smaller)."""
    g = torch.Generator().manual_seed(3)
    ratios = []
    for _ in range(40):
        n = 256
        s = torch.randn(n, generator=g, dtype=torch.float64) * 2
        pt = torch.exp(s - s.max())
        c = torch.randn(n, generator=g, dtype=torch.float64) * 0.03
        eps = torch.rand(n, generator=g, dtype=torch.float64) * 0.14
        a, gs = grid_sums(pt, c, eps)
        L = pt.sum()
        b = (pt * (1 - torch.exp(-c - eps)).clamp_min(0)).sum() / L
        xi = torch.tensor(1e-4, dtype=torch.float64)
        ratios.append(float(X.grid_form_torch(a, gs, xi)) / float(E.excess_form_torch(a, b, xi)))
    ratios = torch.tensor(ratios)
    assert float(ratios.median()) < 0.93 and float(ratios.max()) < 1.01


@pytest.mark.parametrize("seed", range(6))
def test_the_form_is_the_module_docs_formula(seed):
    """Pinned: the twin equals the formula written out again here (every slack in it: the sums' growth 1 + Ξ + 2^-21,
    the signed sum's error (Ξ + 2^-21)·V⁺ on both M's, e^{2Ξ} − 1 rounded up as the excess form's, the result's 2^-40
    and 2^-50), to the
    last bits; dropping any one of them moves the twin off it."""
    g = torch.Generator().manual_seed(seed)
    pt, c, eps = _row(g, 30, 0.03, 0.07)
    a, gs = grid_sums(pt, c, eps)
    for xi in (0.0, 1e-4, 0.01):
        got = float(X.grid_form_torch(a, gs, torch.tensor(xi, dtype=torch.float64)))
        want = _spec_form(float(a), gs.tolist(), xi)
        assert abs(got - want) <= 4e-16 * want
        assert got > 2.0**-50


@pytest.mark.parametrize("name,value", [("SUM_GROWTH", 0.0), ("FORM_REL", 0.0), ("FORM_ABS", 0.0)])
def test_dropping_a_slack_changes_the_form(monkeypatch, name, value):
    g = torch.Generator().manual_seed(1)
    pt, c, eps = _row(g, 30, 0.03, 0.07)
    a, gs = grid_sums(pt, c, eps)
    xi = torch.tensor(0.0, dtype=torch.float64)
    before = float(X.grid_form_torch(a, gs, xi))
    monkeypatch.setattr(X, name, value)
    assert float(X.grid_form_torch(a, gs, xi)) < before


def test_the_measure_change_term_is_needed(monkeypatch):
    """Without E·(S⁺ + t(V⁺ + |λ − 1| M⁺)) (the sums over p̃ taken as sums over p̂) the form falls below a realised
    TV(p, p̂): one token of small mass p̃ whose box is [0, 0.5] in η, the kernel's mass error ξ = +Ξ on it; with the
    term the form holds there (the term is what makes the sums over the kernel's masses bound TV(p, p̂))."""
    g = torch.Generator().manual_seed(0)
    pt = torch.tensor([0.01, 0.99], dtype=torch.float64)
    c, eps = torch.tensor([-0.25, 0.0], dtype=torch.float64), torch.tensor([0.25, 0.0], dtype=torch.float64)
    sgn = torch.tensor([1.0, -1.0], dtype=torch.float64)
    for xi in (0.05, 0.3):
        worst = _worst_tv(pt, c, eps, xi, g, extra=(sgn,))
        assert worst <= _form(pt, c, eps, xi)
    monkeypatch.setattr(X, "expm1_up_torch", lambda y: torch.zeros_like(y))
    for xi in (0.05, 0.3):
        assert _worst_tv(pt, c, eps, xi, g, extra=(sgn,)) > _form(pt, c, eps, xi)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
@pytest.mark.parametrize("where", ["a", "s", "v", "m", "xi"])
def test_a_bad_sum_gives_no_form(bad, where):
    """A NaN or a negative sum (a grid sum, V, Â), a NaN M' (its sign is free) or a NaN / negative / infinite Ξ give 1;
    an infinite sum (an overflow) only empties its own candidates: the value is never below the form without it."""
    g = torch.Generator().manual_seed(2)
    pt, c, eps = _row(g, 8, 0.03, 0.07)
    a, gs = grid_sums(pt, c, eps)
    xi = torch.tensor(1e-4, dtype=torch.float64)
    good = float(X.grid_form_torch(a, gs, xi))
    if where == "a":
        a = torch.tensor(bad, dtype=torch.float64)
    elif where == "s":
        gs[3] = bad
    elif where == "v":
        gs[X.NG + 1] = bad
    elif where == "m":
        if bad == -1e-3:
            pytest.skip("M' is a signed sum: a negative one is a value")
        gs[X.NG] = bad
    else:
        xi = torch.tensor(bad, dtype=torch.float64)
    got = float(X.grid_form_torch(a, gs, xi))
    if bad == float("inf") and where in ("a", "s", "v", "m"):
        assert good <= got <= 1.0
    else:
        assert got == 1.0


def test_no_excess_no_form_value():
    """A row whose every box is 0 (exact tokens) has the form ≤ the cap arithmetic's own slack."""
    a, gs = grid_sums(torch.tensor([0.3, 0.7], dtype=torch.float64), torch.zeros(2, dtype=torch.float64),
                      torch.zeros(2, dtype=torch.float64))
    f = float(X.grid_form_torch(a, gs, torch.tensor(0.0, dtype=torch.float64)))
    assert f < 0.0137 and f >= 0.0  # (the λ > 1 candidates of the last interval: (λ − 1)·t, the cap of the others)


def _partials(seed=5, S=5, Bsz=3, Hq=4, D=64, NB=32):
    g = torch.Generator().manual_seed(seed)
    m_out, l_out, acc, hist, stat, q = synthetic_partials(g, Bsz, Hq, S, D, NB)
    sl = torch.tensor([1, 700, 4096], dtype=torch.int32)
    ex = torch.zeros(Bsz, Hq, S, X.EXCESS_COLS, dtype=torch.float64)
    for b in range(Bsz):
        for h in range(Hq):
            for s in range(S):  # each split's sums from a row of its own (masses scaled to the split's l)
                pt, c, eps = _row(g, 16, 0.03 if h % 2 else 0.3, 0.07 if h % 2 else 0.5)
                a, gs = grid_sums(pt, c, eps)
                bb = (pt * (1 - torch.exp(-c - eps)).clamp_min(0)).sum() / pt.sum()
                ex[b, h, s, 0], ex[b, h, s, 1], ex[b, h, s, 2:] = a, bb, gs
    ex = (ex * l_out[..., None].double()).float().contiguous()
    ex[1, 2, 0, 5] = float("nan")  # a NaN grid sum: the two-sum form alone
    ex[2, 3, :, 2 + X.NG + 1] = -1.0  # a negative V (cannot be)
    c = E.MergeConstants(D=D, T=16, PAGES=8, NB=NB, KA=KEY_LEVELS + 2, sm=0.125, tier_b=False, delta_step=None,
                         gamma=dot_gamma(D), dither_u=0.0, eta=mass_eta_terms(128), out_rel0=0.0)
    return [t.to(DEV) for t in (m_out, l_out, acc, hist, stat, q, sl)], ex.to(DEV), c


def test_fused_merge_with_the_grid_matches_the_torch_merge():
    args, ex, c = _partials()
    r2 = E.merge(*args, c, ex=ex[..., :2].contiguous())[2]  # the two sums alone
    r1 = E.merge(*args, c, ex=ex)[2]
    rt = E.merge_torch(*args, c, ex=ex)[2]
    rtol = 1e-9 if DEV == "cpu" else 1e-7
    for f in ("tv_upper_a", "excess", "eform", "tanh", "tilt", "rho", "xi"):
        torch.testing.assert_close(getattr(r1, f).cpu(), getattr(rt, f).cpu().double(), rtol=rtol, atol=1e-12, msg=f)
    e1, e2 = r1.excess.cpu(), r2.excess.cpu()
    assert torch.all(e1 <= e2) and torch.all(r1.tv_upper_a.cpu() <= r2.tv_upper_a.cpu())
    assert (e1 < e2 * 0.97).sum() >= 2  # the grid binds on the small boxes' rows
    assert e1[1, 2] == e2[1, 2] and e1[2, 3] == e2[2, 3]  # a bad grid sum: the two-sum form
    with pytest.raises(ValueError, match="last axis"):
        E.merge(*args, c, ex=ex[..., :5].contiguous())


def test_the_contract_drift_is_refused(monkeypatch):
    """The merge hard-codes the contract's cover (``COVER``): a different one in the contract fails at the check."""
    monkeypatch.setattr(X, "GRID_TILT_LAMBDAS", ((1.0,), (1.0,), (1.0,)))
    with pytest.raises(ImportError, match="interval 0"):
        X._check_cover()


@pytest.mark.parametrize("scheme,bits,window,qmag", [("int8", 2, (2, 8), 0.3), ("int8", 2, None, 0.3),
                                                      ("int4_group", 4, (2, 8), 0.3), ("fp8_e4m3", 2, (4, 16), 0.3),
                                                      ("kivi2", 4, None, 1.0)])
def test_the_decode_with_the_grid_is_sound_and_never_looser(monkeypatch, scheme, bits, window, qmag):
    """The tile's grid sums through the fused merge: TV⁺ and the excess form with the grid ≤ without it, ≥ the realised
    TV(p, p̂) of the fp64 served attention (exact keys p, served keys p̂), on caches with and without the window."""
    import kernels.decode as Dk
    import kernels.plan as kp
    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")  # the fused merge itself
    n, H, gq, D = 90, 2, 3, 64
    c, bt, k, v, w = sketch_cache(scheme, bits, n=n, H=H, D=D, seed=5)
    g = torch.Generator().manual_seed(9)
    q = (torch.randn(1, H * gq, D, generator=g) * qmag).bfloat16()
    qd = q.to(DEV) if DEV == "cuda" else q.float()
    sl = torch.tensor([n], device=DEV)
    win = window_over(k, v, window)
    recs = {}
    for grid in (False, True):
        monkeypatch.setattr(kp, "EXCESS_GRID", grid)
        recs[grid] = decode(c, qd, bt, sl, num_splits=3, window=win).meter
    on, off = recs[True], recs[False]
    assert on.excess is not None and not on.flag.cpu().any()
    assert torch.all(on.tv_upper_a.cpu() <= off.tv_upper_a.cpu())
    assert torch.all(on.excess.cpu() <= off.excess.cpu())
    sig = 1 / math.sqrt(D)
    kx, vx, khs, vhs, rt, W = fp64_sketch_case(scheme, bits, k, v, w, q, window, sig)
    for hq in range(H * gq):
        h, qq = hq // gq, q[0, hq].double()
        ph = torch.softmax(sig * khs[h] @ qq, 0)
        p = torch.softmax(sig * kx[h] @ qq, 0)
        assert float((p - ph).clamp_min(0).sum()) <= float(on.tv_upper_a[0, hq])
