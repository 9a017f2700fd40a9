"""Adversarial review of 2026-12-01 (token-major ExactStore, row-wise gate re-decode, backend='auto').

* The token-major store against the head-major one it replaced (a copy of the old class below):
  the same tokens, records and exact stores under beams, left padding, gating and crop.
* ``use_kernel``'s fallback reasons.
* ``test_prefill_is_quantized_from_the_exact_store_after_its_async_append_lands`` simulates CUDA's
  asynchronous device-to-host copy (the store's point since ddd6d8a) on the CPU: it failed on
  ddd6d8a (the reference path read the store before the copy landed) and pins the fix.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import witcert.cache as wc
from tests.helpers.tiny import tiny_model
from witcert.store import ExactStore

pytestmark = pytest.mark.gpu  # in the device run (WITCERT_DEVICE=cuda): docs/testing.md


class HeadMajorStore:
    """The ExactStore of 3dcd894 (buffer [B, H, capacity, D]), the oracle of the token-major one."""

    def __init__(self, batch, heads, head_dim, dtype, device, pin=False, **pool_kw):  # (pool, cost, expect: unused)
        self.shape = (int(batch), int(heads), int(head_dim))
        self.dtype, self.device, self.pin, self.n = dtype, torch.device(device), False, 0
        self._buf = torch.empty(batch, heads, 0, head_dim, dtype=dtype, device=self.device)

    @property
    def capacity(self):
        return self._buf.shape[2]

    @property
    def data(self):
        return self._buf[:, :, : self.n]

    def __len__(self):
        return self.n

    def read(self, lo, hi):
        return self._buf[:, :, lo:hi]

    def wait(self):  # synchronous copies: nothing is ever pending
        pass

    def ready(self):
        return self.data

    def crop(self, n):
        if not 0 <= n <= self.n:
            raise ValueError("ExactStore.crop")
        self.n = n

    def release(self):  # (WitCertCache.reset: the memory goes back)
        self.n, self._buf = 0, self._buf[:, :, :0]

    def reorder(self, index):
        new = torch.empty_like(self._buf)
        new[:, :, : self.n].copy_(self._buf.index_select(0, index.to(self._buf.device))[:, :, : self.n])
        self._buf = new

    def append(self, x, record=True):
        B, H, m, D = x.shape
        if (B, H, D) != self.shape:
            raise ValueError("ExactStore: shape")
        need = self.n + m
        if need > self.capacity:
            cap = max(256, 2 * self.capacity, need + need // 2)
            new = torch.empty(B, H, cap, D, dtype=self.dtype, device=self.device)
            new[:, :, : self.n].copy_(self._buf[:, :, : self.n])
            self._buf = new
        self._buf[:, :, self.n: need].copy_(x.detach())
        self.n = need


# --------------------------------------------------------------------------- 1. the store


def test_token_major_store_matches_the_head_major_one_under_every_operation():
    """Appends of 1..300 tokens at B = 3 (growths past the initial capacity), beam reorders,
    crops, appends after a crop: ``data`` equals the head-major store's at every step."""
    g = torch.Generator().manual_seed(5)
    new, old = ExactStore(3, 2, 8, torch.bfloat16, "cpu"), HeadMajorStore(3, 2, 8, torch.bfloat16, "cpu")
    for i, m in enumerate([300, 1, 1, 17, 1, 200, 1, 64, 1, 1, 500, 3]):
        x = torch.randn(3, 2, m, 8, generator=g).to(torch.bfloat16)
        new.append(x)
        old.append(x)
        assert torch.equal(new.data, old.data) and new.data.shape == (3, 2, len(old), 8)
        if i % 3 == 1:
            idx = torch.randint(0, 3, (3,), generator=g)
            new.reorder(idx)
            old.reorder(idx)
        if i % 4 == 2:
            keep = int(torch.randint(0, len(old) + 1, (1,), generator=g))
            new.crop(keep)
            old.crop(keep)
        assert torch.equal(new.data, old.data)
        # per-(sequence, head) block reads (page_in) and token windows (_append_served)
        n = len(old)
        if n:
            lo = int(torch.randint(0, n, (1,), generator=g))
            assert torch.equal(new.data[1, 1, lo: lo + 16], old.data[1, 1, lo: lo + 16])
            assert torch.equal(new.data[..., lo:n, :].contiguous(), old.data[..., lo:n, :].contiguous())


def _gen(model, cache, ids, mask, **kw):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, past_key_values=cache, do_sample=False, pad_token_id=2, **kw)


def _records_equal(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        for f in ("tv_a", "tv_a_pre", "out_err", "flag", "pagein_blocks", "tv_real", "out_err_real"):
            x, y = getattr(ra, f), getattr(rb, f)
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=f)
        assert ra.audit_violations == rb.audit_violations == 0


@pytest.mark.parametrize("scheme,gate,beams", [
    ("kivi2", wc.Gate("risk-ranked", tau=0.0, max_pagein_blocks=2), 2),  # block quantization, page-ins, beams
    ("int8_dither", wc.Gate("certified", tau=0.02, max_pagein_blocks=2), 1),
])
def test_reference_path_is_bit_identical_with_the_head_major_store(monkeypatch, scheme, gate, beams):
    """Reference path, float32 tiny Llama, B = 2 with a left-padded row, audited: tokens, records,
    page-ins and the exact stores equal those with the head-major store; then a crop of 5 tokens
    (assisted decoding's rollback) leaves equal stores and served values."""
    model = tiny_model()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 512, (2, 37), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    ids[1, :6] = 2
    runs = []
    for store in (ExactStore, HeadMajorStore):
        monkeypatch.setattr(wc, "ExactStore", store)
        c = wc.WitCertCache(model.config, scheme=scheme, gate=gate, audit=True, seed=4, backend="reference",
                            delta_req=1e-3 if scheme == "int8_dither" else None)
        seq = _gen(model, c, ids, mask, max_new_tokens=4, min_new_tokens=4, num_beams=beams)
        before = [(lay.exact_k.clone(), lay.exact_v.clone()) for lay in c.layers]
        c.crop(-5)  # (the layer's isinstance checks read the patched name: everything under the same store)
        after = [(lay.exact_k.clone(), lay.exact_v.clone(), lay.k_hat, lay.v_hat, lay.k_wit, lay.n_quantized)
                 for lay in c.layers]
        runs.append((seq, c, before, after, type(c.layers[0]._ek)))
    (s1, c1, b1, a1, t1), (s2, c2, b2, a2, t2) = runs
    assert t1 is ExactStore and t2 is HeadMajorStore
    assert torch.equal(s1, s2)
    _records_equal(c1.records, c2.records)
    np.testing.assert_array_equal(c1.pagein_blocks, c2.pagein_blocks)
    if gate.policy == "risk-ranked":
        assert c1.pagein_blocks.sum() > 0
    for x, y in zip(b1, b2):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
    for x, y in zip(a1, a2):
        assert all(torch.equal(u, v) for u, v in zip(x[:5], y[:5])) and x[5] == y[5]


def test_prefill_is_quantized_from_the_exact_store_after_its_async_append_lands(monkeypatch):
    """Found in review (fixed: ``ExactStore.wait`` / ``ready``, and ``exact_k`` / ``exact_v`` wait).
    On CUDA the store is pinned and, since ddd6d8a, ``append`` is a truly
    asynchronous device-to-host copy (contiguous pinned destination, ``non_blocking=True``): the
    bytes land when the stream gets there. But the readers' slices of the token-major buffer are
    strided whenever B·H > 1 (``data[..., a:b, :]`` with b − a > 1, ``data[b, h, lo:hi]``), and
    ``.to(cuda)`` of a strided CPU tensor first gathers it into a contiguous temporary ON THE HOST,
    immediately, not ordered after the pending copy. ``WitCertLayer._append_served`` does exactly
    that right after the append (the prefill, and kivi2's 16-token block at every 16th step), so
    k̂, v̂ and the witnesses are computed from bytes not yet written (uninitialised / a previous
    request's pinned block): the witnesses are consistent with the garbage, the meter certifies
    it, and attention serves it: a silent wrong bound. (Before ddd6d8a the strided destination
    made the append synchronous, so the same reads were safe.)

    Simulated here on the CPU: an append's bytes land only at the next append (a forward later,
    after generate's per-step host sync) or at ``store.wait()`` (a proposed API: an event recorded
    after the append, synchronised before any host-side read: the fix). Checked: the prompt's
    served keys are the scheme applied to the exact store."""
    class AsyncStore(ExactStore):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._pend = []

        def wait(self):
            for lo, x in self._pend:
                self._put(lo, x.permute(2, 0, 1, 3))
            self._pend = []

        def append(self, x, record=True):
            self.wait()  # the previous forward's copies have landed (generate syncs per step)
            lo = self.n
            super().append(torch.zeros_like(x), record)  # what the host sees before the copy lands
            self._pend.append((lo, x.detach().clone()))

    monkeypatch.setattr(wc, "ExactStore", AsyncStore)
    model = tiny_model()
    ids = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    c = wc.WitCertCache(model.config, scheme="int8", seed=1, backend="reference")
    _gen(model, c, ids, torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2)
    from witcert.schemes import QuantContext, quantize

    for lay in c.layers:
        lay._ek.wait()
        x = lay.exact_k[..., :24, :]
        assert x.abs().amax() > 0
        kh, _ = quantize("int8", x.float(), QuantContext(role="key", seed=c.seed, layer=lay.layer_idx,
                                                         positions=torch.arange(24), block_size=16))
        assert torch.equal(lay.k_hat[..., :24, :], kh.to(lay.k_hat.dtype)), \
            f"layer {lay.layer_idx}: the prompt's served keys were quantized from bytes not yet in the store"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the race needs a CUDA device (run on the H200)")
def test_cuda_strided_read_right_after_an_async_append_sees_the_appended_values():
    """The store-level form of the defect above, on a real GPU: ``_append_served``'s read pattern,
    through ``ready()`` (which waits for the append's event)."""
    bad = 0
    for _ in range(5):
        st = ExactStore(8, 8, 128, torch.bfloat16, "cpu", pin=True)
        x = torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        st.append(x)
        bad += int(not torch.equal(st.ready()[..., 0:4096, :].to("cuda"), x))
    assert bad == 0, f"{bad}/5 reads saw bytes the asynchronous append had not written yet"


# --------------------------------------------------------------------------- 2. row-wise re-decode
# (moved into tests/kernels/test_kernel_gate_cache.py::test_gate_decodes_again_only_the_sequences_it_repaired,
# its Tier B / padded / audited variant)


# --------------------------------------------------------------------------- 3. backend="auto"


def test_auto_fallback_reasons_are_each_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(wc, "_LOGGED_REF", {})
    cfg = tiny_model().config  # head dim 32: a kernel head dim? (SUPPORTED_HEAD_DIMS decides)
    from kernels.paged import SUPPORTED_HEAD_DIMS

    cuda = torch.device("cuda")
    gate = wc.Gate("risk-ranked", max_pagein_blocks=1)
    # every built-in lossy scheme has a kernel now (kivi2 since kernel id 7): a user scheme has none
    from witcert.schemes import register_scheme

    register_scheme("user_nokernel", lambda x: (x.float(), {}), overwrite=True)
    cases = [
        (dict(scheme="user_nokernel", gate=gate), "scheme 'user_nokernel' has no kernel"),
        (dict(scheme="int8", audit=True), "audit=True"),
        (dict(scheme="int8", num_groups=2), "num_groups=2"),
        (dict(scheme="int8", witness="block"), "witness='block'"),
        (dict(scheme="int8", block_size=32), "block_size=32"),
        (dict(scheme="int8", meter=False), "meter=False"),
        (dict(scheme="none"), "scheme 'none' with the meter on"),
    ]
    with caplog.at_level(logging.INFO, logger="witcert.cache"):
        for kw, why in cases:
            for _ in range(3):
                assert not wc.WitCertCache(cfg, **kw).use_kernel(cuda, 2, torch.bfloat16)
            hits = [r for r in caplog.records if why in r.getMessage()]
            assert len(hits) == 1, (why, [r.getMessage() for r in caplog.records])
        # the gate's suffix is logged even when an ungated cache with the same reasons logged first
        assert not wc.WitCertCache(cfg, scheme="int8", audit=True, gate=gate).use_kernel(cuda, 2, torch.bfloat16)
        assert sum("it serves the gate too" in r.getMessage() and "audit=True" in r.getMessage()
                   for r in caplog.records) == 1
        ok = 32 in SUPPORTED_HEAD_DIMS
        assert wc.WitCertCache(cfg, scheme="int8", gate=gate).use_kernel(cuda, 2, torch.bfloat16) == ok
        assert not wc.WitCertCache(cfg, scheme="none", meter=False).use_kernel(cuda, 2, torch.bfloat16)
        assert not wc.WitCertCache(cfg, scheme="int8", gate=gate).use_kernel(cuda, 2, torch.float32)
        assert not wc.WitCertCache(cfg, scheme="int8", gate=gate).use_kernel(torch.device("cpu"), 2, torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the race needs a CUDA device (run on the H200)")
def test_cuda_append_pair_one_event_covers_both_copies():
    """``append_pair`` (the hot path's K and V appends) records one event after both copies:
    a read of either store through ``ready()`` sees its bytes."""
    from witcert.store import append_pair

    bad = 0
    for _ in range(5):
        sk = ExactStore(8, 8, 128, torch.bfloat16, "cpu", pin=True)
        sv = ExactStore(8, 8, 128, torch.bfloat16, "cpu", pin=True)
        k = torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        append_pair(sk, sv, k, v)
        assert sk._landed is sv._landed is not None
        bad += int(not torch.equal(sk.ready()[..., 0:4096, :].to("cuda"), k))
        bad += int(not torch.equal(sv.ready()[..., 0:4096, :].to("cuda"), v))
    assert bad == 0, f"{bad}/10 reads saw bytes an asynchronous append had not written yet"


def test_unrecorded_append_cannot_be_waited_on():
    """An append with ``record=False`` whose caller never set the event: ``wait`` refuses
    (it would otherwise return before the copy landed)."""
    import witcert.store as ws

    st = ExactStore(1, 1, 4, torch.float32, "cpu")
    st._landed = ws._UNRECORDED
    with pytest.raises(RuntimeError, match="append_pair"):
        st.wait()
