"""The centred sketch box's excess form in the merge (``merge_terms._excess_form``, its torch twin
``epilogue.excess_form_torch``; bench/TIGHTNESS.md, "The centred box unbinned, in one pass"): TV(p, p̂) ≤ e^{2Ξ}
max(Â, B̂) for Â = Σ p̃ (e^{−c+ε} − 1)₊ / L, B̂ = Σ p̃ (1 − e^{−c−ε})₊ / L, p̂ ∝ p̃ e^ξ with |ξ| ≤ Ξ (Lean
``tilt_tv_le_excess_rescaled``).

* the form against the exact supremum of TV over the centred box and the kernel's mass error (float64, adversarial
  corners and random points), its slacks pinned, its saturations;
* the fused merge with the partials' sums against the torch merge, the form binding where it is the smallest, a sum
  that is NaN / infinite / negative leaving the other forms, and the deferred tilt's finish giving the fused record
  at a gate's τ (the form counted before the τ decision in both)."""

import math
import os

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fused_merge_kernel")]

from kernels import epilogue as E  # noqa: E402
from kernels.epilogue_jit import FP64_SLACK  # noqa: E402
from kernels.fp_bounds import dot_gamma, mass_eta_terms  # noqa: E402
from kernels.key_levels import KEY_LEVELS  # noqa: E402
from kernels.tilt_batch import TiltBatch  # noqa: E402
from tests.helpers.merge_partials import synthetic_partials  # noqa: E402


def _tv(p, q):
    return float((p - q).clamp_min(0).sum())


def _sums(pt, c, eps):
    """(Â, B̂) of masses ``pt`` (any positive scale) over the centred box c ± ε, float64."""
    L = pt.sum()
    a = (pt * (torch.exp(-c + eps) - 1).clamp_min(0)).sum() / L
    b = (pt * (1 - torch.exp(-c - eps)).clamp_min(0)).sum() / L
    return a, b


@pytest.mark.parametrize("seed", range(12))
def test_the_form_bounds_tv_over_the_centred_box_and_the_mass_error(seed):
    """p̃ the kernel's masses, p̂ ∝ p̃ e^ξ (|ξ| ≤ Ξ) the served distribution, p ∝ p̂ e^η with η = −δ, δ ∈ [c − ε, c +
    ε]: TV(p, p̂) ≤ form (no tanh(Ξ/2): it bounds TV(p, p̂) itself) at the box's worst corners (every threshold of the
    ratio order) and at random points, for ξ of random signs and ξ = ±Ξ against each sum (+Ξ where its term is
    positive: the mass moved onto the tokens that count); with Ξ = 0 the form is max(Â, B̂) up to its slack."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 40, (1,), generator=g))
    pt = torch.rand(n, generator=g, dtype=torch.float64) ** 3 + 1e-6
    scale = 10.0 ** float(torch.empty(1).uniform_(-3, 0.5, generator=g))
    c = torch.randn(n, generator=g, dtype=torch.float64) * scale
    eps = torch.rand(n, generator=g, dtype=torch.float64) * scale
    xi_max = float(torch.tensor([0.0, 1e-6, 1e-3, 0.05])[seed % 4])
    a, b = _sums(pt, c, eps)
    form = float(E.excess_form_torch(a, b, torch.tensor(xi_max, dtype=torch.float64)))
    bound = form
    worst = 0.0
    lo_, hi_ = -c - eps, -c + eps
    patterns = [torch.where(torch.rand(n, generator=g) < 0.5, 1.0, -1.0).double(),
                torch.where(hi_ > 0, 1.0, -1.0).double(), torch.where(lo_ < 0, 1.0, -1.0).double()]
    for sgn in patterns:
        xi = sgn * xi_max
        ph = pt * torch.exp(xi)
        ph = ph / ph.sum()
        lo, hi = -c - eps, -c + eps  # η's interval
        order = torch.argsort(hi - lo, descending=True)
        for k in range(n + 1):  # the corners: η = hi on a set, lo elsewhere (the extremes of TV are at corners)
            for up in (order[:k], order[n - k:]):
                eta = lo.clone()
                eta[up] = hi[up]
                p = ph * torch.exp(eta)
                p = p / p.sum()
                worst = max(worst, _tv(p, ph))
                for t in (torch.argsort(pt * torch.exp(hi)),):  # by the tilted mass, too
                    eta2 = lo.clone()
                    eta2[t[:k]] = hi[t[:k]]
                    p2 = ph * torch.exp(eta2)
                    worst = max(worst, _tv(p2 / p2.sum(), ph))
        for _ in range(50):
            eta = lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)
            p = ph * torch.exp(eta)
            worst = max(worst, _tv(p / p.sum(), ph))
    assert worst <= bound, (worst, bound)
    if xi_max == 0.0:
        assert form <= max(float(a), float(b)) * (1 + 2.0**-20)


@pytest.mark.parametrize("xi_max", [1e-4, 0.05])
def test_the_mass_error_needs_its_factor(xi_max):
    """A row where the two sums over p̂ are attained (one token raised, one lowered, Z = 1) and the kernel's p̃ holds
    less mass on both than p̂ (the neutral token's went up by e^{2Ξ} against theirs): TV(p, p̂) is above max(Ã, B̃) even
    grown by the sums' own 1 + Ξ + 2^-21, so the form's e^{2Ξ} is needed, and the form holds."""
    pt = torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64)
    xi = torch.tensor([xi_max, xi_max, -xi_max], dtype=torch.float64)
    ph = pt * torch.exp(xi)
    ph = ph / ph.sum()
    up = 0.5  # token 0's η; token 1's makes Z = Σ p̂ e^η = 1; token 2 is neutral (η = 0)
    e1 = (1 - ph[0] * math.exp(up) - ph[2]) / ph[1]
    c = torch.tensor([-up, -math.log(e1), 0.0], dtype=torch.float64)
    eps = torch.zeros(3, dtype=torch.float64)
    p = ph * torch.exp(-c)
    assert abs(float(p.sum()) - 1) < 1e-12
    real = _tv(p / p.sum(), ph)
    a, b = _sums(pt, c, eps)
    assert real > max(float(a), float(b)) * (1 + xi_max + 2.0**-21)
    assert real <= float(E.excess_form_torch(a, b, torch.tensor(xi_max, dtype=torch.float64)))


def test_the_forms_slacks_are_pinned():
    """Each slack of ``_excess_form`` is in the value: the sums' growth (1 + Ξ + 2^-21, their fp32 accumulation), e^{2Ξ}
    = 1 + E(2Ξ) rounded up (the series below 2^-10), the result's 2^-40; dropping one lowers the value below these."""
    a = torch.tensor([0.01, 0.2, 0.0, 0.3], dtype=torch.float64)
    b = torch.tensor([0.02, 0.1, 0.0, 0.3], dtype=torch.float64)
    xi = torch.tensor([0.0, 1e-4, 0.0, 0.01], dtype=torch.float64)
    f = E.excess_form_torch(a, b, xi)
    grow = 1 + xi + 2.0**-21
    y = 2 * xi
    e2 = 1 + torch.where(y < 2.0**-10, y + y**2 / 2 + y**3, torch.expm1(y)) * (1 + 2.0**-40)
    want = e2 * torch.maximum(a * grow, b * grow) * (1 + 2.0**-40)
    assert torch.equal(f, want)
    assert f[0] > 0.02 * (1 + 2.0**-22)  # the 2^-21 growth
    assert f[1] > math.exp(2e-4) * 0.2 * (1 + 1e-4)  # e^{2Ξ} and the Ξ growth
    assert f[2] == 0.0  # no excess, no Ξ: 0 (the form may certify a row exactly; _tv_row adds its own slack)
    assert f[3] > math.exp(0.02) * 0.3 * 1.01


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
def test_a_bad_sum_gives_no_form(bad):
    """A NaN, an infinite or a negative sum (or Ξ) gives 1: no form, the others stay (never a value below them)."""
    ok = torch.tensor([0.01], dtype=torch.float64)
    wrong = torch.tensor([bad], dtype=torch.float64)
    xi = torch.tensor([1e-5], dtype=torch.float64)
    assert E.excess_form_torch(wrong, ok, xi).item() == 1.0
    assert E.excess_form_torch(ok, wrong, xi).item() == 1.0
    assert E.excess_form_torch(ok, ok, wrong).item() == 1.0


def _partials(seed=5, S=5, Bsz=3, Hq=4, D=64, NB=32):
    g = torch.Generator().manual_seed(seed)
    m_out, l_out, acc, hist, stat, q = synthetic_partials(g, Bsz, Hq, S, D, NB)
    sl = torch.tensor([1, 700, 4096], dtype=torch.int32)
    # the excess sums: a share of l per split, small on some rows (the form binds), large on others (it does not)
    frac = torch.rand(Bsz, Hq, 1, 2, generator=g) * torch.tensor([1e-4, 0.3]).repeat(Hq // 2)[None, :, None, None]
    ex = (l_out[..., None] * frac).float().contiguous()
    ex[1, 2, 0, 0] = float("nan")  # a NaN sum: that row keeps its other forms
    ex[2, 3, 1, 1] = float("inf")
    ex[2, 0, 1, 0] = -1.0  # a negative sum (cannot be: no form)
    c = E.MergeConstants(D=D, T=16, PAGES=8, NB=NB, KA=KEY_LEVELS + 2, sm=0.125, tier_b=False, delta_step=None,
                         gamma=dot_gamma(D), dither_u=0.0, eta=mass_eta_terms(128), out_rel0=0.0)
    return [t.to(DEV) for t in (m_out, l_out, acc, hist, stat, q, sl)], ex.to(DEV), c


def test_fused_merge_with_the_sums_matches_the_torch_merge():
    args, ex, c = _partials()
    o0, _, r0 = E.merge(*args, c)  # without the sums
    o1, _, r1 = E.merge(*args, c, ex=ex)
    o2, _, r2 = E.merge_torch(*args, c, ex=ex)
    assert r0.excess is None and r1.excess is not None
    torch.testing.assert_close(o1, o0, rtol=0, atol=0)
    rt = 1e-9 if DEV == "cpu" else 1e-7
    for f in ("tv_upper_a", "excess", "eform", "tanh", "tilt", "rho", "xi"):
        torch.testing.assert_close(getattr(r1, f).cpu(), getattr(r2, f).cpu().double(), rtol=rt, atol=1e-12, msg=f)
    tv0, tv1, exc = r0.tv_upper_a.cpu(), r1.tv_upper_a.cpu(), r1.excess.cpu()
    rho = r1.rho.cpu()
    assert torch.all(tv1 <= tv0)  # a third form never raises TV⁺
    with_form = torch.clamp(exc + rho + FP64_SLACK, max=1.0)  # (Ξ is in the form: no tanh(Ξ/2))
    live = tv0 > 0
    # TV⁺ = min(without the form, the form's own TV⁺) on every row with a token past the first
    torch.testing.assert_close(tv1[live], torch.minimum(tv0, with_form)[live], rtol=1e-12, atol=0)
    binds = live & (with_form < tv0)
    assert binds.sum() >= 2 and (live & ~binds).sum() >= 2  # both cases occur in the case
    for b, h in ((1, 2), (2, 3), (2, 0)):  # the NaN, infinite and negative sums: no form, the other forms kept
        assert exc[b, h] == 1.0 and tv1[b, h] == tv0[b, h]
    assert torch.all(r1.tv_upper_a.cpu()[0] == 0)  # one token: TV = 0


@pytest.mark.parametrize("tau", [0.0, 0.01, 0.05])
def test_the_deferred_finish_counts_the_form_before_its_tau(tau):
    """The form enters the τ decision in the fused merge and in the deferred tilt's finish alike (REC_EXCESS): rows it
    certifies at τ skip the tilt in both, and the records agree."""
    args, ex, c = _partials(seed=7)
    fused = E.merge(*args, c, ex=ex, tilt_above=tau)[2]
    Bsz, Hq = args[0].shape[:2]
    batch = TiltBatch.allocate(layers=1, rows=Bsz * Hq, nb=c.NB, device=DEV)
    deferred = E.merge(*args, c, ex=ex, tilt_batch=batch, tilt_layer=0)[2]
    batch.finish(tilt_above=tau)
    for f in ("tv_upper_a", "out_err_upper", "tilt", "excess"):
        a, b = getattr(deferred, f).cpu(), getattr(fused, f).cpu()
        if DEV == "cpu":
            assert torch.equal(a, b), f
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=0, msg=f)
