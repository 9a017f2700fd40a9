"""The gate (witcert.gate) without a model: synthetic block risks, a fake exact store whose
bound is the risk still unrepaired, and a page-in callback that records what it moved."""

import math

import numpy as np
import pytest
import torch

from witcert.gate import Gate, block_risk, exceeds, repair, select_blocks

BYTES = 4096  # what the fake store says one page-in moved


class FakeStore:
    """Per (b, h) block risks; the bound of (b, h) is the risk still unrepaired (a stand-in for
    the meter: paging a block in removes its contribution)."""

    def __init__(self, risks, tau):
        self.risk0 = torch.as_tensor(risks, dtype=torch.float64)
        self.repaired = torch.zeros(self.risk0.shape, dtype=torch.bool)
        self.tau = tau
        self.calls = []  # every page_in call, repaired or not
        self.remeasured = 0

    def risk(self):
        return torch.where(self.repaired, torch.zeros_like(self.risk0), self.risk0)

    def bound(self):
        return self.risk().sum(-1)

    def over(self):
        return (self.bound() > self.tau).numpy()

    def page_in(self, b, h, blk):
        self.calls.append((b, h, blk))
        if bool(self.repaired[b, h, blk]):
            return 0  # idempotent: already exact, nothing moved
        self.repaired[b, h, blk] = True
        return BYTES

    def remeasure(self):
        self.remeasured += 1

    def run(self, gate):
        return repair(gate, self.over, self.risk, self.page_in, self.remeasure)


def test_risk_ranked_pages_the_top_blocks_in_risk_order():
    s = FakeStore([[[0.1, 0.5, 0.0, 0.3, 0.2]]], tau=0.0)
    r = s.run(Gate("risk-ranked", max_pagein_blocks=2))
    assert r.paged == [(0, 0, 1, BYTES), (0, 0, 3, BYTES)]
    assert r.pagein.tolist() == [[2]] and r.rounds == 1 and s.remeasured == 1
    # one round only, even though the bound still exceeds τ = 0
    assert s.over().tolist() == [[True]]


def test_risk_ranked_never_pages_zero_risk_blocks_and_respects_the_budget():
    s = FakeStore([[[0.0, 0.7, 0.0, 0.0]]], tau=0.0)
    r = s.run(Gate("risk-ranked", max_pagein_blocks=3))
    assert r.paged == [(0, 0, 1, BYTES)] and r.pagein.tolist() == [[1]]
    s = FakeStore([[[0.4, 0.3, 0.2, 0.1]]], tau=0.0)
    r = s.run(Gate("risk-ranked", max_pagein_blocks=3))
    assert [p[2] for p in r.paged] == [0, 1, 2] and r.pagein.tolist() == [[3]]


def test_only_kv_heads_over_tau_are_repaired():
    # head 0's bound 0.9 > τ = 0.5; head 1's 0.3 ≤ τ: untouched
    s = FakeStore([[[0.6, 0.3], [0.2, 0.1]]], tau=0.5)
    r = s.run(Gate("risk-ranked", tau=0.5, max_pagein_blocks=2))
    assert r.pagein.tolist() == [[2, 0]]
    assert {(b, h) for b, h, _, _ in r.paged} == {(0, 0)}


def test_min_share_and_min_risk_floor_the_choice():
    risks = [[[0.6, 0.3, 0.05, 0.05]]]  # total 1.0
    r = FakeStore(risks, tau=0.0).run(Gate("risk-ranked", max_pagein_blocks=4, min_share=0.2))
    assert [p[2] for p in r.paged] == [0, 1]  # 0.05 < 0.2 × 1.0
    r = FakeStore(risks, tau=0.0).run(Gate("risk-ranked", max_pagein_blocks=4, min_risk=0.35))
    assert [p[2] for p in r.paged] == [0]
    r = FakeStore(risks, tau=0.0).run(Gate("risk-ranked", max_pagein_blocks=4, min_share=0.7))
    assert r.paged == [] and r.rounds == 0 and r.pagein.tolist() == [[0]]
    # the floor is the larger of the two
    r = FakeStore(risks, tau=0.0).run(Gate("risk-ranked", max_pagein_blocks=4, min_share=0.04, min_risk=0.1))
    assert [p[2] for p in r.paged] == [0, 1]


def test_certified_pages_one_block_per_round_until_the_bound_holds():
    s = FakeStore([[[0.05, 0.4, 0.02, 0.3]]], tau=0.1)
    r = s.run(Gate("certified", tau=0.1, max_pagein_blocks=8))
    # round 1: block 1 (bound 0.77 → 0.37); round 2: block 3 (→ 0.07 ≤ τ): stop
    assert [p[2] for p in r.paged] == [1, 3]
    assert r.rounds == 2 and s.remeasured == 2 and r.pagein.tolist() == [[2]]
    assert float(s.bound()[0, 0]) == pytest.approx(0.07) and not s.over().any()


def test_certified_stops_when_the_budget_is_spent_and_the_row_stays_over():
    s = FakeStore([[[0.3, 0.3, 0.3, 0.3]]], tau=0.01)
    gate = Gate("certified", tau=0.01, max_pagein_blocks=2)
    r = s.run(gate)
    assert r.pagein.tolist() == [[2]] and r.rounds == 2
    # what the caller flags: the bound still exceeds τ after the loop
    assert bool(exceeds(gate, s.bound())[0, 0])


def test_certified_with_several_sequences_and_heads():
    risks = [[[0.5, 0.1], [0.0, 0.0]],  # seq 0: head 0 needs 1 block (0.6 → 0.1 ≤ 0.2), head 1 holds
             [[0.3, 0.4], [0.2, 0.25]]]  # seq 1: head 0 needs 2 blocks, head 1 one (0.45 → 0.2)
    s = FakeStore(risks, tau=0.2)
    r = s.run(Gate("certified", tau=0.2, max_pagein_blocks=4))
    assert r.pagein.tolist() == [[1, 0], [2, 1]]
    assert r.paged == [(0, 0, 0, BYTES), (1, 0, 1, BYTES), (1, 1, 1, BYTES), (1, 0, 0, BYTES)]
    assert r.rounds == 2 and not s.over().any()


def test_repair_is_idempotent():
    s = FakeStore([[[0.3, 0.6, 0.1]]], tau=0.0)
    gate = Gate("risk-ranked", max_pagein_blocks=2)
    first = s.run(gate)
    assert [p[2] for p in first.paged] == [1, 0]
    again = s.run(gate)  # the repaired blocks have risk 0 now: only block 2 remains
    assert [p[2] for p in again.paged] == [2] and again.pagein.tolist() == [[1]]
    # a page-in that moves nothing (already exact) is not counted and ends the loop
    calls = []
    r = repair(Gate("certified", tau=0.1, max_pagein_blocks=5), lambda: np.array([[True]]),
               lambda: torch.tensor([[[0.0, 0.9]]], dtype=torch.float64),
               lambda b, h, blk: calls.append(blk) or 0)
    assert calls == [1] and r.paged == [] and r.rounds == 0 and r.pagein.tolist() == [[0]]


def test_a_zero_budget_pages_nothing():
    s = FakeStore([[[0.9]]], tau=0.0)
    r = s.run(Gate("risk-ranked", max_pagein_blocks=0))
    assert r.paged == [] and s.calls == [] and r.pagein.tolist() == [[0]]


def test_select_blocks_directly():
    risk = torch.tensor([[[0.1, 0.4, 0.2], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    need = np.array([[True, True]])
    got = select_blocks(Gate("risk-ranked", max_pagein_blocks=3), risk, need, np.array([[1, 0]]))
    assert got == [(0, 0, [1, 2]), (0, 1, [])]  # head 0 has 2 blocks of budget left
    got = select_blocks(Gate("certified", tau=0.1), risk, need, np.zeros((1, 2), dtype=np.int64))
    assert got == [(0, 0, [1]), (0, 1, [])]


def test_exceeds_tiers_and_tau_v():
    tv = torch.tensor([0.05, 0.3, 0.3])
    tv_b = torch.tensor([0.5, 0.05, 0.5])
    err = torch.tensor([2.0, 0.0, 0.0])
    assert exceeds(Gate("certified", tau=0.1), tv).tolist() == [False, True, True]
    assert exceeds(Gate("certified", tau=0.1, tier="B"), tv, tv_b).tolist() == [False, False, True]
    assert exceeds(Gate("certified", tau=0.1, tau_v=1.0), tv, None, err).tolist() == [True, True, True]
    assert exceeds(Gate("risk-ranked", tau=0.2), tv.numpy()).tolist() == [False, True, True]
    # a NaN bound (or E⁺_V) is never within τ: it exceeds, in torch and numpy, either tier
    nan = torch.tensor([float("nan"), 0.05])
    assert exceeds(Gate("certified", tau=0.1), nan).tolist() == [True, False]
    assert exceeds(Gate("certified", tau=0.1), nan.numpy()).tolist() == [True, False]
    assert exceeds(Gate("certified", tau=0.1, tier="B"), torch.tensor([0.5, 0.05]), nan).tolist() == [True, False]
    assert exceeds(Gate("certified", tau=0.1, tau_v=1.0), torch.tensor([0.05, 0.05]), None, nan).tolist() == [True, False]


def test_block_risk_is_the_first_order_eform_share_per_block():
    # one (seq, kv head), one query head and row, n = 5 tokens, blocks of T = 2 (3 blocks)
    logits = torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    eps = torch.tensor([0.1, 0.0, 0.3, 0.2, 0.05], dtype=torch.float64)
    allowed = torch.tensor([True, True, True, True, False])  # token 4 masked: no risk
    pm = torch.where(allowed, torch.softmax(logits.masked_fill(~allowed, -math.inf), -1), torch.zeros(5, dtype=torch.float64))
    sh = lambda x: x.view(1, 1, 1, 1, 5)  # noqa: E731
    kw = dict(block_size=2, num_blocks=3)
    rep = torch.zeros(1, 1, 3, dtype=torch.bool)
    rb = block_risk(sh(pm), sh(logits), sh(allowed), torch.ones(1, 1, 1, 1, dtype=torch.bool), sh(eps),
                    repaired=rep, **kw)
    per_tok = pm * (torch.exp(eps) - 1)
    want = torch.stack([per_tok[0:2].sum(), per_tok[2:4].sum(), torch.zeros((), dtype=torch.float64)])
    torch.testing.assert_close(rb[0, 0], want, rtol=1e-12, atol=1e-15)
    # a repaired block carries no risk; τ_v adds Σ p̂ φ / τ_v
    rep[0, 0, 0] = True
    v_wit = torch.tensor([[[1.0, 0.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)
    rb2 = block_risk(sh(pm), sh(logits), sh(allowed), torch.ones(1, 1, 1, 1, dtype=torch.bool), sh(eps),
                     repaired=rep, v_wit=v_wit, tau_v=0.5, **kw)
    assert float(rb2[0, 0, 0]) == 0.0
    torch.testing.assert_close(rb2[0, 0, 1:], want[1:], rtol=1e-12, atol=1e-15)
    rep[0, 0, 0] = False
    rb3 = block_risk(sh(pm), sh(logits), sh(allowed), torch.ones(1, 1, 1, 1, dtype=torch.bool), sh(eps),
                     repaired=rep, v_wit=v_wit, tau_v=0.5, **kw)
    torch.testing.assert_close(rb3[0, 0, 0], want[0] + pm[0] * 1.0 / 0.5, rtol=1e-12, atol=1e-15)


def test_gate_is_reexported_by_the_cache():
    from witcert import cache

    assert cache.Gate is Gate
    with pytest.raises(ValueError, match="certified"):
        Gate("certified", tau=1.5)
    assert Gate("risk-ranked").tau == 0.0 and Gate().tau == 0.1
