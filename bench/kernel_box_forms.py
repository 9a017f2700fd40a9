"""Which form of the sketch box could the decode kernel bin? (issue 33: the kernel path's tightness)

The reference path meters the centred box |δ_hj − c_hj| ≤ ε_hj (c_hj = σ⟨q_h, r̃_j⟩, ε_hj = c_h W_j) with
fine levels; the decode kernel bins one symmetric level per token, shared by the query heads of a kv head:
ε_hj = c_h·L(W_j + u_j), u_j = max_h |c_hj| / c_h, L(x) the key-side grid of ratio √2 (``kernels.key_levels``).
This script meters, on the same rows, the forms a kernel could bin instead, all from one ``witcert tightness``
run's decode steps (its 1,080 (prompt, step, layer, head) rows at the defaults):

    centred           the reference path's centred box (what ``witcert tightness`` reports)
    shared_sqrt2      the kernels' form today: one level per token, grid √2
    shared_q          the same on a grid of ratio 2^(1/4)
    per_head_sqrt2    one level per (token, head): L(W_j + |c_hj| / c_h), grid √2 (a per-head one-hot)
    per_head_q        the same on a grid of ratio 2^(1/4)
    per_head_exact    per head, exact radii c_h W_j + |c_hj|
    shift_mean        shared √2 levels around a per-head constant centre μ_h (the p̂-weighted mean of c_hj:
                      a common shift is free, SPEC §3), radius c_h·L(W_j + max_h |c_hj − μ_h| / c_h)
    triangle_exact    TV(p̂, p̃) + tilt(p̃, c_h W_j), p̃ ∝ p̂ e^{−c} (a triangle through the sketch-corrected
                      distribution), with the exact TV(p̂, p̃)
    triangle_pinsker  the same with TV(p̂, p̃) ≤ min(√(KL/2), ½√χ²) (online sums a kernel could keep) and the
                      tilt on the shared √2 grid of W_j alone
    two_point         per shared √2 level of W_j, the centres replaced by the two-point distribution on their
                      exact range within the level with the same mass and mean of e^{−c} (Edmundson–Madansky:
                      sound, from per-level sums Σ p̂, Σ p̂ e^{−c} and a per-level range)
    top{K}            the centred box (exact centre and radius) on each row's K tokens of largest served mass p̂,
                      the kernels' shared √2 level on the rest (K in ``TOP_K``: what a kernel keeping a per-head
                      reservoir of its heaviest tokens beside today's histogram could meter)
    sv_sqrt2 / sv_q / sv_exact   a different served cache: the keys served sketch-corrected (k̂ + r̃, so the
                      served distribution is p̃), its box symmetric about 0 with the key-side radius c_h W_j
                      (levels √2, 2^(1/4), exact); these forms' ratios are against TV(p̃, p) (``sv_real``,
                      reported as their ``median_real``), not the other forms' TV(p̂, p)

Every form is sound (each is a valid box or a valid bound); each row's real TV is against exact attention in
fp64. Offline: wraps ``witcert.meter.measure`` and the reference path's audit to keep the inputs of each decode
row (the cache has no public hook for them).

    python bench/kernel_box_forms.py [--scheme int8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import witcert.cache_reference as CR
from witcert import bounds as B
from witcert import meter as M
from witcert import tightness as T
from witcert.bounds.dual_grid import TILT_DEFAULT_TOL, _tilt_row_box

X0 = 2.0**-14  # kernels.key_levels.X0 (the grid's first edge)
TOP_K = (8, 16, 32, 64)


def grid_up(x: np.ndarray, ratio_log2: float) -> np.ndarray:
    """x rounded up onto X0·2^(k·ratio_log2), k ≥ 0 (0 stays 0)."""
    k = np.ceil(np.log2(np.maximum(x, 1e-300) / X0) / ratio_log2)
    out = X0 * 2.0 ** (np.maximum(k, 0) * ratio_log2)
    out = np.where(out < x, out * 2.0**ratio_log2, out)
    return np.where(x > 0, out, 0.0)


def capture_rows(scheme: str) -> tuple[list, object]:
    """Run ``witcert tightness`` once, keeping each decode row's served logits, p̂, box (ε, c), mask and the exact p."""
    rows, cur = [], {}
    measure0, audit0 = M.measure, CR.ReferencePath._audit

    def measure(logits, radius, *, mask=None, p_hat=None, center=None, **kw):
        if logits.shape[-2] == 1 and center is not None:
            cur["m"] = {k: None if v is None else v.detach().double().cpu().numpy() for k, v in
                        (("logits", logits), ("eps", radius), ("c", center), ("p", p_hat))}
            cur["m"]["mask"] = None if mask is None else mask.detach().cpu().numpy()
        return measure0(logits, radius, mask=mask, p_hat=p_hat, center=center, **kw)

    def audit(self, layer, q, al, sm, ev, m, *rest):
        out = audit0(self, layer, q, al, sm, ev, m, *rest)
        if "m" in cur and q.shape[-2] == 1:
            ek = layer.exact_k.to(layer.device).double()
            p, _ = CR._softmax(sm * torch.einsum("bhgld,bhnd->bhgln", q.double(), ek), al)
            d = cur.pop("m")
            d["p_exact"], d["tv"] = p.cpu().numpy(), np.asarray(m["tv"].cpu() if hasattr(m["tv"], "cpu") else m["tv"])
            rows.append(d)
        return out

    CR.M.measure, CR.ReferencePath._audit = measure, audit
    try:
        res = T.run(scheme=scheme, backend="reference", sketch_box="centred")
    finally:
        CR.M.measure, CR.ReferencePath._audit = measure0, audit0
    return rows, res


def head_factors(e: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A kv head's query-head factors c_h (up to a common factor: ε_hj = c_h W_j with W_j := ε_0j, the median over
    its compressed tokens) and the kernels' shared sketch term u_j = max_h |c_hj| / c_h, from its rows' centred radii
    ``e`` and centres ``c`` [GQ, n] (window and repaired tokens: ε = c = 0)."""
    nz = e[0] > 0
    ch = np.array([np.median(e[g][nz] / e[0][nz]) for g in range(e.shape[0])])
    return ch, np.max(np.abs(c) / ch[:, None], axis=0)


def two_point_items(w, x, L, lid):
    """Per level id: the centres' two-point replacement (module doc), as box items (w, up, down)."""
    ws, ups, downs = [], [], []
    for k in np.unique(lid):
        sel = lid == k
        wl, Lk = w[sel].sum(), L[sel].max()
        lo, hi = x[sel].min(), x[sel].max()
        elo, ehi = np.exp(lo), np.exp(hi)
        if wl <= 0:
            continue
        if ehi - elo <= 1e-15 * ehi:
            ws, ups, downs = ws + [wl], ups + [hi + Lk], downs + [lo - Lk]
            continue
        whi = float(np.clip(((w[sel] * np.exp(x[sel])).sum() - wl * elo) / (ehi - elo), 0.0, wl))
        ws, ups, downs = ws + [wl - whi, whi], ups + [lo + Lk, hi + Lk], downs + [lo - Lk, hi - Lk]
    return np.array(ws), np.array(ups), np.array(downs)


def forms(rows) -> dict:
    """Each form's bound per row, and the real TV (module doc)."""
    out: dict = {k: [] for k in ("real", "centred", "shared_sqrt2", "shared_q", "per_head_sqrt2", "per_head_q",
                                 "per_head_exact", "shift_mean", "triangle_exact", "triangle_pinsker", "two_point", "sv_real", "sv_sqrt2", "sv_q", "sv_exact",
                                 *(f"top{k}" for k in TOP_K))}
    tvb = lambda s, e, mk, c=None: float(B.tv_bound_logits(s, e, mask=mk, center=c))  # noqa: E731
    for d in rows:
        lg, E, C, P, PE = d["logits"], d["eps"], d["c"], d["p"], d["p_exact"]
        _, Hkv, GQ, _, _ = lg.shape
        mk_all = np.ones(lg.shape, bool) if d["mask"] is None else np.broadcast_to(d["mask"], lg.shape)
        for h in range(Hkv):
            e, c, mk = E[0, h, :, 0], C[0, h, :, 0], mk_all[0, h, 0, 0]
            nz = e[0] > 0  # compressed tokens (the window's and repaired ones have ε = c = 0)
            ch, u = head_factors(e, c)
            W = e[0]
            pw = P[0, h, :, 0]
            mu = np.array([(pw[g][nz & mk] * c[g][nz & mk]).sum() / max(pw[g][nz & mk].sum(), 1e-300)
                           for g in range(GQ)])
            dev = np.where(nz[None, :], np.abs(c - mu[:, None]), np.abs(mu)[:, None])  # exact tokens: δ = 0
            u_mu = np.max(dev / ch[:, None], axis=0)
            for g in range(GQ):
                s, p, pe = lg[0, h, g, 0], P[0, h, g, 0], PE[0, h, g, 0]
                out["real"].append(0.5 * np.abs(p - pe)[mk].sum())
                out["centred"].append(float(d["tv"][0, h, g, 0]))
                out["shared_sqrt2"].append(tvb(s, ch[g] * grid_up(W + u, 0.5), mk))
                out["shared_q"].append(tvb(s, ch[g] * grid_up(W + u, 0.25), mk))
                out["per_head_sqrt2"].append(tvb(s, ch[g] * grid_up(W + np.abs(c[g]) / ch[g], 0.5), mk))
                out["per_head_q"].append(tvb(s, ch[g] * grid_up(W + np.abs(c[g]) / ch[g], 0.25), mk))
                out["per_head_exact"].append(tvb(s, ch[g] * W + np.abs(c[g]), mk))
                out["shift_mean"].append(tvb(s, ch[g] * grid_up(W + u_mu, 0.5), mk, np.full_like(s, mu[g])))
                # p̃ ∝ p̂ e^{−c}: the exact p ∝ p̃ e^{−(δ − c)}, |δ − c| ≤ c_h W
                st = s - c[g]
                pt = np.where(mk, np.exp(st - st[mk].max()), 0.0)
                pt /= pt.sum()
                pp = np.where(mk, p, 0.0)
                t1 = 0.5 * np.abs(pp - pt).sum()
                w, x = pp[mk], -c[g][mk]
                xm = x - (w * x).sum()
                ee, ee2 = (w * np.exp(xm)).sum(), (w * np.exp(2 * xm)).sum()
                t1_online = min(np.sqrt(max(np.log(ee), 0.0) / 2), 0.5 * np.sqrt(max(ee2 / ee**2 - 1, 0.0)))
                out["sv_real"].append(0.5 * np.abs(pt - np.where(mk, pe, 0.0)).sum())
                out["sv_sqrt2"].append(tvb(st, ch[g] * grid_up(W, 0.5), mk))
                out["sv_q"].append(tvb(st, ch[g] * grid_up(W, 0.25), mk))
                out["sv_exact"].append(tvb(st, ch[g] * W, mk))
                out["triangle_exact"].append(min(1.0, t1 + tvb(st, ch[g] * W, mk)))
                out["triangle_pinsker"].append(min(1.0, t1_online + tvb(st, ch[g] * grid_up(W, 0.5), mk)))
                ws = np.exp(s[mk] - s[mk].max())
                sym = ch[g] * grid_up(W + u, 0.5)[mk]
                order = np.argsort(-ws)
                for k in TOP_K:  # δ ∈ [c − ε, c + ε] on the top k (η = −δ), |δ| ≤ the shared level elsewhere
                    up, down, top = sym.copy(), -sym, order[:k]
                    up[top] = -c[g][mk][top] + ch[g] * W[mk][top]
                    down[top] = -c[g][mk][top] - ch[g] * W[mk][top]
                    out[f"top{k}"].append(_tilt_row_box(ws / ws.sum(), up, down, TILT_DEFAULT_TOL, 1 << 15))
                Wl = grid_up(W[mk], 0.5)
                lid = np.round(2 * np.log2(np.maximum(Wl, 1e-300))).astype(int)
                out["two_point"].append(_tilt_row_box(*two_point_items(ws / ws.sum(), x, ch[g] * Wl, lid),
                                                      TILT_DEFAULT_TOL, 1 << 15))
    return out


def summary(out: dict) -> dict:
    r = np.asarray(out["real"])
    pos = r > 0
    res = {}
    for k, v in out.items():
        if k in ("real", "sv_real"):
            continue
        if k.startswith("sv_"):
            rr, v = np.asarray(out["sv_real"]), np.asarray(v)
            ps = rr > 0
            res[k] = {"median_bound": float(np.median(v)), "median_ratio": float(np.median(v[ps] / rr[ps])),
                      "cov_05": float(np.mean(v <= 0.05)), "violations": int(np.sum(v < rr)),
                      "median_real": float(np.median(rr))}
            continue
        v = np.asarray(v)
        res[k] = {"median_bound": float(np.median(v)), "median_ratio": float(np.median(v[pos] / r[pos])),
                  "cov_05": float(np.mean(v <= 0.05)), "violations": int(np.sum(v < r))}
    return {"rows": int(r.size), "median_real": float(np.median(r)), "forms": res}


def parse_args(doc: str, argv=None) -> argparse.Namespace:
    """``--scheme`` (default int8) and ``--out`` (the JSON file) of an offline forms script (``doc``: its docstring)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--scheme", default="int8")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(__doc__, argv)
    t0 = time.time()
    rows, res = capture_rows(a.scheme)
    s = summary(forms(rows))
    s.update(scheme=a.scheme, tightness_median_bound=res.median_bound, tightness_rows=res.rows,
             seconds=round(time.time() - t0, 1))
    emit(s, a.out)


def emit(summary: dict, out: str | None) -> None:
    """Print a run's summary as JSON, and write it to ``out`` (if given)."""
    text = json.dumps(summary, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
