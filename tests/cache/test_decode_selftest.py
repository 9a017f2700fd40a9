"""``witcert.selftest_decode``: the once-per-process check of the compiled metered decode (its TV⁺ against the fractional
supremum over the box its own stored witnesses imply and against the realised TV, its E⁺ against the served output's
error) passes on every scheme and radius form, refuses a decode whose bound comes out low, and guards the kernel path of
``WitCertCache`` (eager and graphed steps). On the CPU the decode runs in Triton's interpreter; under
``WITCERT_DEVICE=cuda`` on the GPU."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if os.environ.get("WITCERT_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.exact_window import ExactWindow  # noqa: E402
from kernels.paged import PagedKV  # noqa: E402
from kernels.plan import plan_decode  # noqa: E402
from kernels.repair import RepairOverlay  # noqa: E402
from tests.helpers.faulty_decode import patch_decode  # noqa: E402
from witcert import selftest_decode as SD  # noqa: E402

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
QDT = torch.bfloat16 if DEV == "cuda" else torch.float32
H, GQ, D = 2, 3, 64


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(SD, "_CHECKED", set())


def _case(scheme="int8", bits=2, weights=True, window=(4, 64), head_levels=False, G=1, delta=None, splits=None,
          qdt=QDT, rep=False, masked=False):
    """(paged, plan, window, delta_step, overlay, masked) of a cache configuration as WitCertCache's kernel path
    allocates it (``rep``: an overlay with a page in it, as a gated cache after a page-in or kivi2's held page)."""
    w = 2.0 ** torch.randint(-1, 2, (H, D), generator=torch.Generator().manual_seed(3)).float() if weights else None
    p = PagedKV.allocate(8, H, D, scheme=scheme, num_groups=G, sketch_bits=bits, weights=w, with_exact=False,
                         device=DEV, head_levels=head_levels)
    win = ExactWindow.allocate(2, H, D, qdt, *window, device=DEV) if window else None
    ov = None
    if rep:
        ov = RepairOverlay.allocate(8, H, 16, D, qdt, device=DEV).bind(p)
        ov.page_in(0, 0, torch.randn(16, D).to(qdt), torch.randn(16, D).to(qdt))
    plan = plan_decode(p, 2, H * GQ, qdt, DEV, 512, meter=True, window=win, delta_step=delta, num_splits=splits,
                       repair=ov)
    tm = torch.ones(2, 512, dtype=torch.bool, device=DEV) if masked else None
    return p, plan, win, delta, ov, tm


def _check(case, **kw):
    p, plan, win, ds, ov, tm = case
    return SD.check_decode_kernel(p, plan, QDT, D ** -0.5, H * GQ, window=win, delta_step=ds, repair=ov, token_mask=tm,
                                  table_width=32, **kw)


CASES = {  # the defaults of each scheme on the kernel path, and the forms without a sketch or window
    "int8 sketch window (shared levels)": dict(),
    "int8 group radius, 4 groups, 3 splits": dict(bits=0, weights=False, window=None, G=4, splits=3),
    "int8_dither Tier B": dict(scheme="int8_dither", delta=1e-6),
    "fp8_e4m3 per-head levels": dict(scheme="fp8_e4m3", head_levels=True),
    "fp8_e5m2 per-head levels": dict(scheme="fp8_e5m2", head_levels=True),
    "int4_group per-head levels": dict(scheme="int4_group", bits=4, head_levels=True),
    "kivi2 per-head levels": dict(scheme="kivi2", bits=4, head_levels=True),
    # the overlay (HAS_REP: a gated cache after a page-in; kivi2's cache always holds its partial page there) and the
    # padding mask (HAS_MASK)
    "int8 sketch window, overlay, padding mask": dict(rep=True, masked=True),
    "kivi2 overlay": dict(scheme="kivi2", bits=4, head_levels=True, rep=True),
    "int8 group radius, padding mask": dict(bits=0, weights=False, window=None, masked=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_form_passes_once(name):
    case = _case(**CASES[name])
    r = _check(case)
    assert r is not None and r.rows == 2 * H * GQ
    # every canary row says something (TV⁺ < 1) and the kernel's bound is above the box's supremum, by the binning
    assert r.informative_rows == r.rows and r.worst_tv_margin > 0 and 1.0 < r.worst_tv_ratio < 2.0
    assert 0 < r.worst_err_ratio <= 1.0
    assert _check(case) is None  # once


_patched_decode = patch_decode


FAULTS = {  # (the record's change, what the message names)
    # every row's TV⁺ × 0.8: the canary's smallest TV⁺ / supremum is 1.05-1.17 (measured in the interpreter), so some row goes below
    "TV⁺ × 0.8": (lambda r: r.tv_upper_a.mul_(0.8), "fractional supremum"),
    "TV⁺ 0": (lambda r: r.tv_upper_a.zero_(), "below the realised TV"),
    "E⁺ × 0.01": (lambda r: r.out_err_upper.mul_(0.01), "E⁺"),
    "one row flagged": (lambda r: r.flag.view(-1)[3].fill_(True), "flagged"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("name", ["int8 sketch window (shared levels)", "kivi2 overlay"])
def test_a_low_bound_is_refused(monkeypatch, name, fault):
    change, named = FAULTS[fault]
    _patched_decode(monkeypatch, change)
    case = _case(**CASES[name])
    with pytest.raises(SD.DecodeSelfTestError, match=named):
        _check(case)
    assert not SD._CHECKED  # a failed configuration is checked again next time


def test_the_realised_tv_check_is_not_the_only_one(monkeypatch):
    """A TV⁺ lowered to just above the realised TV passes that check but not the supremum's: the lower check reads
    the stored box, not only this canary's realised error."""
    case = _case()
    _patched_decode(monkeypatch, lambda rec: rec.tv_upper_a.mul_(0.5))
    with pytest.raises(SD.DecodeSelfTestError) as e:
        _check(case)
    assert "fractional supremum" in str(e.value) and "realised TV" not in str(e.value)


def test_the_key_follows_the_launch():
    """What Triton compiles apart is checked apart: another tile, query dtype, window, overlay with pages, padding mask
    (and its stride's class), batch class or merge warps, table width class, output dtype, or split
    count class (an int is specialized on 1 and on multiples of 16) or its power of two (the merge's SP); another split
    count of the same class and power of two, or another layer, is not checked again."""
    p, plan, win, ds, ov, _ = _case(splits=3)
    key = lambda pl=plan, dt=QDT, w=win, **kw: SD.decode_key(p, pl, dt, H * GQ, w, **kw)  # noqa: E731
    base = key()
    assert SD.check_decode_kernel(p, plan, QDT, D ** -0.5, H * GQ, window=win) is not None
    same = dataclasses.replace(plan, num_splits=2)  # (class 2, power of two... 2 ≠ 4: another SP)
    assert key(same) != base
    assert key(dataclasses.replace(plan, num_splits=3)) == base
    for other in (dataclasses.replace(plan, num_splits=1), dataclasses.replace(plan, num_splits=5),
                  dataclasses.replace(plan, tile=dataclasses.replace(plan.tile, warps=2))):
        assert key(other) != base
    assert key(dt=torch.float16) != base and key(w=None) != base
    mask = torch.ones(2, 512, dtype=torch.bool)
    assert key(token_mask=mask) != base and key(token_mask=mask) != key(token_mask=torch.ones(2, 500, dtype=torch.bool))
    # a strided mask is read as its contiguous copy (row stride = its width): keyed so
    strided = torch.ones(2, 1040, dtype=torch.bool)[:, ::2]
    assert key(token_mask=strided) == key(token_mask=torch.ones(2, 520, dtype=torch.bool)) != key(token_mask=mask)
    assert key(batch=16) != base and key(table_width=32) != key(table_width=33) and key(out_dtype=QDT) != base
    ov = RepairOverlay.allocate(8, H, 16, D, QDT, device=DEV).bind(p)
    assert key(repair=ov) == base  # an empty overlay: HAS_REP off
    ov.page_in(0, 0, torch.zeros(4, D, dtype=QDT), torch.zeros(4, D, dtype=QDT))
    assert key(repair=ov) != base
    p.layer, p.seed = 3, 1  # (the decode kernel does not specialize them: one binary, checked once)
    assert key() == base
    assert SD.check_decode_kernel(p, plan, QDT, D ** -0.5, H * GQ, window=win) is None
    assert len(SD._CHECKED) == 1


def test_the_caller_batch_and_copies(monkeypatch):
    """With the caller's batch the canary decodes copies of its two sequences, whose rows must equal theirs bit for
    bit: a fault in one program of the grid (as the fp8 write's clip was) is refused."""
    case = _case()
    r = _check(case, batch=5, out_dtype=QDT)
    assert r is not None and r.rows == 2 * H * GQ
    monkeypatch.setattr(SD, "_CHECKED", set())
    _patched_decode(monkeypatch, lambda rec: rec.tv_upper_a[4].mul_(0.999))
    with pytest.raises(SD.DecodeSelfTestError, match="copy of sequence 0"):
        _check(case, batch=5, out_dtype=QDT)


def test_a_copy_with_a_low_tier_b_bound_is_refused(monkeypatch):
    """Tier B's TV⁺ (a Tier B gate decides on min(TV⁺_A, TV⁺_B)) of a copy is compared with its sequence's too."""
    case = _case(**CASES["int8_dither Tier B"])
    _patched_decode(monkeypatch, lambda rec: rec.tv_upper_b[2].mul_(0.5))
    with pytest.raises(SD.DecodeSelfTestError, match="copy of sequence 0"):
        _check(case, batch=3)


def test_a_one_page_table_runs_one_page_sequences():
    """A cache of ≤ T tokens has a one-page block table (an int Triton specializes as 1): the canary's too."""
    p, plan, win, ds, ov, tm = _case(window=None)
    r = SD.check_decode_kernel(p, plan, QDT, D ** -0.5, H * GQ, table_width=1)
    assert r is not None and r.rows == 2 * H * GQ


def test_tier_b_is_checked(monkeypatch):
    """int8_dither with a delta_step: Tier B's TV⁺ against the fractional supremum over the dither radius."""
    _patched_decode(monkeypatch, lambda rec: rec.tv_upper_b.mul_(0.5))
    with pytest.raises(SD.DecodeSelfTestError, match="Tier B"):
        _check(_case(**CASES["int8_dither Tier B"]))


def _model():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from witcert.cache import use_witcert

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      num_hidden_layers=2, intermediate_size=64, vocab_size=64, max_position_embeddings=256)
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    return use_witcert(LlamaForCausalLM(cfg).eval().to(dtype).to(DEV))


@pytest.mark.parametrize("graph", [False, True])
def test_the_kernel_path_cache_runs_it(monkeypatch, graph):
    """WitCertCache's kernel path (eager, and the graphed step's eager first run) checks its decode before the first
    metered step, once per launch configuration; a faulty decode stops the request."""
    from witcert.cache import WitCertCache

    model = _model()
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1)).to(DEV)
    calls = []
    real_check = SD.check_decode_kernel

    def counted(*a, **kw):
        calls.append(a[1])
        return real_check(*a, **kw)

    monkeypatch.setattr(SD, "check_decode_kernel", counted)

    def gen(cache):
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=4,
                           do_sample=False, pad_token_id=0)

    kw = dict(scheme="int8", backend="kernel", seed=5, window=(4, 8), cuda_graph=graph)
    gen(WitCertCache(model.config, **kw))
    # each layer checks its launch before its first decode step and again only when the plan changes (the memo: at
    # most once per layer and step, 2 layers × 3 decode steps); the process checks each distinct launch once
    assert 2 <= len(calls) <= 6 and len(SD._CHECKED) == len(set(calls))
    _patched_decode(monkeypatch, lambda r: r.tv_upper_a.mul_(0.5))
    monkeypatch.setattr(SD, "_CHECKED", set())
    # (on the GPU a graphed request of the same shape would replay the first one's capture, checked when it was made:
    # no eager step, nothing to check; emptied, the next request captures again after an eager step)
    from witcert.graph_pool import POOL

    POOL.clear()
    with pytest.raises(SD.DecodeSelfTestError, match="backend='reference'"):
        gen(WitCertCache(model.config, **kw))
