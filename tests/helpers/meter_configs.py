"""Cache runs whose meter records pin the reference path bit for bit (``tests/cache/test_meter_step.py``).

``run_all()`` drives ``WitCertCache(backend="reference")`` on small random-weight Llamas through
every branch of the reference meter: per-token and block witnesses, G = 1 and 2, Tier B (anytime
and fixed, and gating on it), risk-ranked and certified gates (with τ_v), a left-padded batch
(rows without keys), chunked prefill (Lq ≤ 4 rows: with the tilt; Lq > 4: closed forms only), a
float64 model, fp8, and the reviewed underflowed-p̂ case. It returns a flat dict of numpy arrays.

``python -m tests.helpers.meter_configs OUT.npz`` writes them. ``tests/data/meter_step_reference.npz``
was written by the code *before* the meter was moved into ``witcert.meter`` (commit 4a0bbb8), and pins the
group-witness radius: every cache here is built with ``sketch_bits=0`` and no exact window (the sketch
radius and the window are tested in tests/kernels/test_sketch_window.py). Re-recorded 2026-12-04 (issue 33) when the
dual-grid tilt took its endpoint form (``witcert.bounds.dual_grid._tilt_row``: each interval's upper value at its ends,
never above the former t_{i+1} − D(t_i, λ_i) for the same λ): 585 of 1673 arrays moved, tilts within the
branch-and-bound tolerance, and four certified gates paged in fewer blocks (their bounds are tighter);
except the six ``*kivi2*`` configurations: re-recorded (branch kivi2-kernel) when kivi2 took the
kernels' arithmetic (fp16 scale rounded up / zero rounded down, ``witcert.schemes._asym_f16``),
which moves its served values; every other array was checked unchanged (within the cross-host
tolerance) before the merge, and no discrete kivi2 field (ids, page-ins, flags, audit) changed.
Re-recorded 2026-12-06 when E⁺ took the rounding of the served output into the model's dtype (the reference path
computes in float64 and serves the model's float32: ``bounds.stored_output_error_bound``, Lean
``output_error_stored_le``) and the audit's realised error became the served output's: only ``out_err`` (123 arrays,
every value up, by 6e-8 relative up to the store's ~1e-7·‖o‖ on repaired rows whose E⁺ was ~1e-12, below the served
float32 output's own error) and ``out_err_real`` (121) moved; no discrete field, no page-in, no flag.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

RECORD_FIELDS = ("tv_a", "tv_a_pre", "out_err", "tv_b", "tv_b_pre", "flag", "nonfinite", "pagein_blocks",
                 "delta_step", "delta_spent", "parts_pre", "tv_real", "out_err_real", "audit_violations")


def _tiny_llama(dtype=torch.float32, seed=0, layers=2, hq=2, hkv=1, d=64, hidden=128, vocab=64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, num_attention_heads=hq, num_key_value_heads=hkv, head_dim=d,
                      num_hidden_layers=layers, intermediate_size=64, vocab_size=vocab, max_position_embeddings=512)
    from witcert.cache import use_witcert

    return use_witcert(LlamaForCausalLM(cfg).eval().to(dtype))


def _flatten(name: str, cache, ids=None) -> dict:
    out = {}
    for i, r in enumerate(cache.records):
        for f in RECORD_FIELDS:
            v = getattr(r, f)
            if v is None:
                continue
            out[f"{name}/{i:03d}/{f}"] = np.asarray(v)
        out[f"{name}/{i:03d}/step_layer"] = np.array([r.step, r.layer])
    out[f"{name}/pagein_blocks"] = cache.pagein_blocks.copy()
    out[f"{name}/pagein_bytes"] = cache.pagein_bytes.copy()
    out[f"{name}/num_records"] = np.array(len(cache.records))
    if ids is not None:
        out[f"{name}/ids"] = ids.detach().cpu().numpy()
    return out


def _generate(model, cache, ids, mask=None, new=4):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask, past_key_values=cache,
                              max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)


def _ids(n, vocab, seed=1, batch=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, n), generator=g)


def _generations(WitCertCache, Gate, gqa, out):
    """Greedy generations on the GQA model through every scheme, witness form, Tier B and gate."""
    gens = {
        "int8": dict(scheme="int8"),
        "int8_g2_block": dict(scheme="int8", num_groups=2, witness="block"),
        "fp8_e4m3": dict(scheme="fp8_e4m3"),
        "int8_dither_anytime": dict(scheme="int8_dither", delta_req=1e-3),
        "int8_dither_fixed_gateB": dict(scheme="int8_dither", delta_req=1e-3, schedule="fixed", horizon=8,
                                        gate=Gate("certified", tau=0.0008, tier="B", max_pagein_blocks=2)),
        "kivi2_riskranked": dict(scheme="kivi2", gate=Gate("risk-ranked", tau=0.0, max_pagein_blocks=2, min_share=0.2)),
        "kivi2_certified_tauv": dict(scheme="kivi2", gate=Gate("certified", tau=0.1, tau_v=0.5, max_pagein_blocks=3)),
        "kivi2_certified_flags": dict(scheme="kivi2", gate=Gate("certified", tau=0.001, max_pagein_blocks=1)),
        "int4_group_certified": dict(scheme="int4_group", gate=Gate("certified", tau=0.011, max_pagein_blocks=2)),
    }
    for name, kw in gens.items():
        cache = WitCertCache(gqa.config, audit=True, seed=3, backend="reference", **kw)
        ids = _generate(gqa, cache, _ids(37, 128))
        out.update(_flatten(name, cache, ids))


def _left_padded(WitCertCache, Gate, gqa, out):
    # a left-padded batch of 2: rows of the padded sequence with no key are dead (placeholder, zeroed)
    ids = _ids(30, 128, seed=2, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    for name, kw in {"pad_int8": dict(scheme="int8"),
                     "pad_kivi2_gate": dict(scheme="kivi2", gate=Gate("risk-ranked", max_pagein_blocks=1))}.items():
        cache = WitCertCache(gqa.config, audit=True, seed=4, backend="reference", **kw)
        out.update(_flatten(name, cache, _generate(gqa, cache, ids, mask=mask, new=3)))


def _chunked_prefill(WitCertCache, Gate, gqa, out):
    # chunked prefill: 3 rows (tilt on), then 6 rows (closed forms only), then one decode row
    for name, kw in {"chunks_int8": dict(scheme="int8"),
                     "chunks_dither": dict(scheme="int8_dither", delta_req=1e-3),
                     "chunks_kivi2_gate": dict(scheme="kivi2", gate=Gate("certified", tau=0.03, max_pagein_blocks=2))}.items():
        cache = WitCertCache(gqa.config, audit=True, seed=5, backend="reference", **kw)
        full = _ids(40, 128, seed=6)
        logits = []
        with torch.no_grad():
            for a, b in ((0, 30), (30, 33), (33, 39), (39, 40)):
                pos = torch.arange(a, b)[None]
                o = gqa(input_ids=full[:, a:b], past_key_values=cache, use_cache=True, position_ids=pos,
                        cache_position=torch.arange(a, b))
                logits.append(o.logits[0, -1].double().numpy())
        out.update(_flatten(name, cache))
        out[f"{name}/logits"] = np.stack(logits)


def _float64(WitCertCache, Gate, out):
    """A float64 model, gated (exact tokens stay float64)."""
    m64 = _tiny_llama(torch.float64)
    for name, kw in {"f64_int8_certified": dict(scheme="int8", gate=Gate("certified", tau=0.0014, max_pagein_blocks=1)),
                     "f64_kivi2": dict(scheme="kivi2")}.items():
        cache = WitCertCache(m64.config, audit=True, seed=0, backend="reference", **kw)
        out.update(_flatten(name, cache, _generate(m64, cache, _ids(41, 64, seed=1, batch=1) % 64)))


def _underflow(WitCertCache, out):
    """The reviewed underflowed-p̂ case (tests/cache/test_cache_edges.py), driven through served_attention."""
    from transformers import LlamaConfig

    for scheme in ("int8", "int4_group", "int8_dither"):
        cfg = LlamaConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                          num_hidden_layers=1, intermediate_size=32, vocab_size=16)
        cache = WitCertCache(cfg, scheme=scheme, audit=True, seed=0,
                             delta_req=1e-3 if scheme == "int8_dither" else None)
        x, D = 800.0 / 8, 64
        keys = torch.zeros(3, D)
        keys[0, 1] = x
        keys[1, 0], keys[1, 1] = 1024 * x, x
        keys[2, 1] = x
        values = torch.zeros(3, D)
        values[0, 0] = values[1, 1] = values[2, 0] = 1.0
        q = torch.zeros(1, D)
        q[0, 1] = 64.0
        lay = cache.layers[0]
        k, v = keys[None, None], values[None, None]
        cache.update(k[:, :, :-1], v[:, :, :-1], 0)
        lay._pending = None
        cache.update(k[:, :, -1:], v[:, :, -1:], 0)

        class _Attn(torch.nn.Module):
            layer_idx = 0

        o, _ = cache.served_attention(_Attn(), q[None, :, None, :], torch.ones(1, 1, 1, 3, dtype=torch.bool), 1.0 / 8)
        lay._pending = None
        out.update(_flatten(f"underflow_{scheme}", cache))
        out[f"underflow_{scheme}/o"] = o.detach().numpy()


def run_all() -> dict:
    from witcert.cache import Gate
    from witcert.cache import WitCertCache as _Cache

    def WitCertCache(*args, **kw):  # the fixture pins the group-witness radius (no residual sketch)
        kw.setdefault("sketch_bits", 0)
        kw.setdefault("window", None)
        return _Cache(*args, **kw)

    out = {}
    # a GQA model (4 query heads over 2 kv heads, d = 32), as tests/helpers/tiny.py
    gqa = _tiny_llama(layers=3, hq=4, hkv=2, d=32, vocab=128)
    _generations(WitCertCache, Gate, gqa, out)
    _left_padded(WitCertCache, Gate, gqa, out)
    _chunked_prefill(WitCertCache, Gate, gqa, out)
    _float64(WitCertCache, Gate, out)
    _underflow(WitCertCache, out)
    return out


if __name__ == "__main__":
    res = run_all()
    np.savez_compressed(sys.argv[1], **res)
    print(f"{len(res)} arrays -> {sys.argv[1]}")
