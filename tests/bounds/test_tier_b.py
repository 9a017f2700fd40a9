"""SPEC §5, Tier B: the dithered-INT8 certificate holds at its stated failure rate.

Each trial is an independent dither stream (a different kv-head index in the counter-based
PRNG key) applied to the same keys, with one fixed query (non-adaptive, as §5 requires).
"""

import math

import numpy as np
import pytest
import torch

from witcert import bounds as B
from witcert import schemes as S

Z999 = 3.2905  # two-sided 99.9% normal quantile


def keys_with_spread_scales(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, d, generator=g)
    k[0] *= 60.0  # one token with a much larger scale (a sink / outlier token)
    k[1:8] *= 0.05
    return k


def violations(k, q, trials, delta_step, averaged=False, seed=0, chunk=2000, shrink=1.0):
    """Number of trials in which some token has |δ_j| > t_j."""
    n, d = k.shape
    sigma = 1.0 / math.sqrt(d)
    bad = 0
    for start in range(0, trials, chunk):
        m = min(chunk, trials - start)
        x = k.expand(m, n, d).contiguous()
        ctx = S.QuantContext(seed=seed, layer=0, kv_head=torch.arange(start, start + m))
        x_hat, meta = S.quantize("int8_dither", x, ctx)
        delta = sigma * torch.einsum("d,tnd->tn", q.double(), x_hat.double() - x.double())
        scales = meta["scale"][0].double()  # identical for every trial: x is the same
        V = B.dither_variance_proxy(q.double(), scales, sigma)
        if averaged:  # the retracted shortcut: one proxy for all tokens
            V = V.mean().expand_as(V)
        t = B.dither_radius(V, n, delta_step, bias=B.dither_bias_bound(q.double(), scales, sigma))
        bad += int((delta.abs() > shrink * t).any(dim=-1).sum())
    return bad


def test_tier_b_failure_rate_within_delta():
    n, d, trials, delta_step = 64, 64, 4000, 0.2
    k = keys_with_spread_scales(n, d, 1)
    q = torch.randn(d, generator=torch.Generator().manual_seed(2)) * 3
    bad = violations(k, q, trials, delta_step)
    margin = Z999 * math.sqrt(delta_step * (1 - delta_step) / trials)
    assert bad / trials <= delta_step + margin, f"{bad}/{trials} violations at δ_step = {delta_step}"


def test_detector_catches_an_undersized_radius():
    # the same harness with the radius halved (unsound on purpose) must see violations above δ
    n, d, trials, delta_step = 64, 64, 2000, 0.05
    k = keys_with_spread_scales(n, d, 1)
    q = torch.randn(d, generator=torch.Generator().manual_seed(2)) * 3
    bad = violations(k, q, trials, delta_step, shrink=0.5)
    rate = bad / trials
    assert rate - Z999 * math.sqrt(max(rate * (1 - rate), 1e-12) / trials) > delta_step, f"only {bad}/{trials}"
    with pytest.raises(ValueError, match="delta_step"):
        B.dither_radius(torch.ones(3), n, 1.0)


def test_averaging_the_variance_proxy_is_unsound():
    n, d, trials, delta_step = 64, 64, 2000, 0.05
    k = keys_with_spread_scales(n, d, 1)
    q = torch.randn(d, generator=torch.Generator().manual_seed(2)) * 3
    bad = violations(k, q, trials, delta_step, averaged=True)
    rate = bad / trials
    lower = rate - Z999 * math.sqrt(max(rate * (1 - rate), 1e-12) / trials)
    assert lower > delta_step, f"the averaged shortcut violated only {bad}/{trials} times"
    # and the per-token proxy on the very same streams holds
    assert violations(k, q, trials, delta_step) / trials <= delta_step + Z999 * math.sqrt(delta_step * (1 - delta_step) / trials)


def test_variance_proxy_per_channel_and_validation():
    q = torch.tensor([1.0, 2.0], dtype=torch.float64)
    s_tok = torch.tensor([0.5, 1.0], dtype=torch.float64)
    s_ch = torch.tensor([[0.5, 0.5], [1.0, 1.0]], dtype=torch.float64)
    v1 = B.dither_variance_proxy(q, s_tok, 2.0)
    v2 = B.dither_variance_proxy(q, s_ch, 2.0)
    torch.testing.assert_close(v1, v2)
    torch.testing.assert_close(v1, torch.tensor([4 * 5 * 0.25 / 12, 4 * 5 * 1.0 / 12], dtype=torch.float64), rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="scales"):
        B.dither_variance_proxy(q, torch.ones(2, 3, 4), 1.0)
    with pytest.raises(ValueError, match="scales"):
        B.dither_variance_proxy(q, -s_tok, 1.0)
    assert torch.isinf(B.dither_variance_proxy(torch.tensor([float("nan"), 1.0]), s_tok, 1.0)).all()


def test_step_budget_schedules_sum_to_at_most_delta():
    L, H, T = 30, 9, 500
    fixed = sum(B.step_budget(1e-3, L, H, horizon=T) for _ in range(T)) * L * H
    assert fixed <= 1e-3 * (1 + 1e-12)
    anytime = sum(B.step_budget(1e-3, L, H, step=t) for t in range(1, 200_000)) * L * H
    assert anytime <= 1e-3
    assert anytime > 0.999 * 1e-3  # it is the 6/π² schedule, not something smaller
    with pytest.raises(ValueError, match="exactly one"):
        B.step_budget(1e-3, L, H)
    with pytest.raises(ValueError, match="exactly one"):
        B.step_budget(1e-3, L, H, horizon=3, step=1)
    with pytest.raises(ValueError, match="step"):
        B.step_budget(1e-3, L, H, step=0)
    with pytest.raises(ValueError, match="delta_req"):
        B.step_budget(2.0, L, H, horizon=3)


@pytest.mark.soak
def test_soak_tier_b_million_trials():
    n, d, trials, delta_step = 64, 64, 1_000_000, 1e-3
    k = keys_with_spread_scales(n, d, 3)
    q = torch.randn(d, generator=torch.Generator().manual_seed(4)) * 3
    bad = violations(k, q, trials, delta_step, seed=11, chunk=4000)
    limit = delta_step + Z999 * math.sqrt(delta_step * (1 - delta_step) / trials)
    # a single |δ_j| > t_j is allowed with probability δ_step: the certificate is violated only
    # if the exceedance *rate* is above δ_step (beyond the binomial 99.9% margin)
    print(f"\nTier B soak: {bad} exceedances in {trials} trials, rate {bad / trials:.2e} "
          f"(allowed δ_step = {delta_step}); rate violations: {int(bad / trials > limit)}")
    assert bad / trials <= limit


@pytest.mark.soak
def test_soak_tier_a_million_instances():
    """10^6 random (p̂, ε) instances: tanh and e-form vs the brute-force supremum, vectorised;
    the full dual-grid tilt bound on 20 000 of them."""
    rng = np.random.default_rng(12345)
    total_bad = 0
    checked = 0
    for n in range(1, 11):
        m = 100_000
        logits = rng.standard_t(3, (m, n)) * rng.choice([0.3, 2.0, 6.0], (m, 1))
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        eps = rng.exponential(1.0, (m, n)) * rng.choice([1e-3, 0.05, 0.5, 3.0], (m, 1))
        eq = rng.random(m) < 0.2
        eps[eq] = eps[eq, :1]
        sup = B.tv_sup_bruteforce(p, eps)
        bad = int(np.sum(B.tv_bound_tanh(eps) < sup - 1e-14)) + int(np.sum(B.tv_bound_eform(p, eps) < sup - 1e-14))
        tilt_rows = slice(0, 2000)
        bad += int(np.sum(B.tv_bound_tilt(p[tilt_rows], eps[tilt_rows]) < sup[tilt_rows] - 1e-14))
        total_bad += bad
        checked += m
    print(f"\nTier A soak: {total_bad} violations in {checked} instances")
    assert total_bad == 0
