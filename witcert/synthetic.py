"""Synthetic decode workloads that look like real attention, metered by the fp64 reference.

One step: a query ``q`` and ``n`` cached keys/values of one head, built so that the logits are
heavy-tailed (Student-t), a few sink / needle tokens dominate, and a few key channels carry
large outliers (as real key caches do). The keys are quantized with a real scheme, witnesses
are taken per token (T = 1, G groups), and every §3 bound is compared with the realised TV.
Used by ``witcert demo`` (until the model demo exists) and ``bench/tightness.py``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from . import bounds as B
from .meter import measure, served_radius
from .schemes import QuantContext, quantize

#: radius levels for the level-rounded tilt bound of the reference tables: 0 plus a geometric
#: ladder (ratio ≈ 1.35). This is not the decode kernel's grid, which bins ‖W_j‖ and s_j on the
#: key side with ratio √2 (kernels/key_levels.py).
DEFAULT_LEVELS = np.concatenate([[0.0], np.geomspace(2.0**-10, 8.0, 31)])


@dataclasses.dataclass
class StepResult:
    n: int
    scheme: str
    realised_tv: float
    tanh: float
    eform: float
    tilt: float
    max_abs_delta: float
    eps_max: float
    workload: str = ""


def make_step(rng: np.random.Generator, n: int, d: int = 128, outlier_channels: int = 4, sinks: int = 4, outlier_std: float = 12.0):
    """(q, k) for one decode step of one head; keys in float32 as a model would store them."""
    sigma = 1.0 / math.sqrt(d)
    q = rng.standard_normal(d)
    q /= np.linalg.norm(q)
    q *= math.sqrt(d)  # ‖q‖ ≈ √d, so σ‖q‖ ≈ 1
    logits = rng.standard_t(4, n)
    needle = rng.choice(n, size=min(sinks, n), replace=False)
    # sink / needle tokens carrying about half of the mass at every context length
    logits[needle] = math.log(n) + rng.uniform(-1.0, 1.0, needle.size)
    # keys: a component along q that produces the logits, plus orthogonal noise, plus
    # per-channel outliers shared by all tokens (shift logits uniformly: softmax-invariant)
    qq = float(q @ q)
    noise = rng.standard_normal((n, d))
    noise -= np.outer(noise @ q / qq, q)
    k = np.outer(logits / (sigma * qq), q) + noise
    ch = rng.choice(d, size=outlier_channels, replace=False)
    k[:, ch] += rng.normal(0.0, outlier_std, outlier_channels)
    return q, k.astype(np.float32), sigma


def meter_step(q, k, sigma, scheme: str, groups, levels=DEFAULT_LEVELS, seed: int = 0, block_size: int = 1) -> StepResult:
    """Quantize the keys with ``scheme`` and return realised TV and the §3 bounds
    (witnesses per token for ``block_size`` 1, else block maxima). The bounds are
    ``witcert.meter.measure`` (the meter step of the cache's reference path) on this workload."""
    n = k.shape[0]
    k_t = torch.from_numpy(k)
    k_hat = quantize(scheme, k_t.unsqueeze(0), QuantContext(role="key", seed=seed))[0][0].double().numpy()
    k64 = k.astype(np.float64)
    s = sigma * (k64 @ q)
    s_hat = sigma * (k_hat @ q)
    W = B.key_witness(k64, k_hat, groups, block_size=block_size)
    eps = B.logit_radius(q, W, groups, sigma, block_size=block_size, n=n)
    p = np.exp(s - s.max())
    p /= p.sum()
    p_hat = np.exp(s_hat - s_hat.max())
    p_hat /= p_hat.sum()
    # the fp64 rounding of the served logits joins the radius; the meter reads the logits (log
    # domain), so a p̂ that underflowed in the softmax above never hides a token (SPEC §7)
    eps_served = served_radius(eps, q, k_hat, sigma)
    tanh, eform, tilt = (float(x) for x in measure(s_hat, eps_served, levels=levels).parts)
    return StepResult(
        n=n,
        scheme=scheme,
        realised_tv=float(B.tv(p, p_hat)),
        tanh=tanh,
        eform=eform,
        tilt=tilt,
        max_abs_delta=float(np.max(np.abs(s_hat - s))),
        eps_max=float(np.max(eps)),
    )


def run_workload(schemes, lengths, steps: int, d: int = 128, num_groups: int = 4, seed: int = 0, progress=None,
                 outlier_channels: int = 4, outlier_std: float = 12.0, workload: str = ""):
    """Meter ``steps`` synthetic steps for every (scheme, n); returns a list of StepResult."""
    groups = B.group_slices(d, num_groups)
    out = []
    total = len(lengths) * steps
    done = 0
    for n in lengths:
        for i in range(steps):
            rng = np.random.default_rng([seed, n, i])
            q, k, sigma = make_step(rng, n, d, outlier_channels=outlier_channels, outlier_std=outlier_std)
            for sch in schemes:
                r = meter_step(q, k, sigma, sch, groups, seed=seed + i)
                r.workload = workload
                if not (r.realised_tv <= min(r.tanh, r.eform, r.tilt)):
                    raise AssertionError(f"bound below realised TV: {r}")  # never silently wrong
                out.append(r)
            done += 1
            if progress:
                progress(done, total)
    return out


def coverage_table(results, taus=(0.05, 0.1, 0.2)) -> str:
    """Text table: per (scheme, n) coverage at each τ for realised/tanh/e-form/tilt, and the
    median ratio bound/realised of each bound."""
    rows = []
    keys = sorted({(r.workload, r.scheme, r.n) for r in results})
    head = f"{'workload':<9}{'scheme':<16}{'n':>7}{'steps':>6} " + " ".join(
        f"{'cov@' + str(t) + ' real/tanh/eform/tilt':>34}" for t in taus
    ) + f"{'median bound/real tanh/eform/tilt':>38}{'med TV':>9}"
    rows.append(head)
    for wl, sch, n in keys:
        rs = [r for r in results if r.workload == wl and r.scheme == sch and r.n == n]
        cells = []
        for t in taus:
            c = [np.mean([getattr(r, f) <= t for r in rs]) for f in ("realised_tv", "tanh", "eform", "tilt")]
            cells.append(f"{'/'.join(f'{x:.2f}' for x in c):>34}")
        real = np.array([r.realised_tv for r in rs])
        ratios = []
        for f in ("tanh", "eform", "tilt"):
            b = np.array([getattr(r, f) for r in rs])
            ok = real > 0
            ratios.append(np.median(b[ok] / real[ok]) if ok.any() else float("nan"))
        rows.append(
            f"{wl:<9}{sch:<16}{n:>7}{len(rs):>6} " + " ".join(cells) + f"{'/'.join(f'{x:.3g}' for x in ratios):>38}{np.median(real):>9.2e}"
        )
    return "\n".join(rows)


def granularity_table(schemes, n: int = 4096, steps: int = 16, d: int = 128, seed: int = 2) -> str:
    """Median TV⁺ (min of the three §3 bounds) for witnesses per token or per 16-token block,
    with G = 1 or 4 groups, on the outlier workload; and the witness bytes per token."""
    configs = [(1, 1), (1, 4), (16, 1), (16, 4)]
    lines = [f"{'scheme':<16}" + "".join(f"{f'T={t},G={g}':>14}" for t, g in configs) + "   (median TV⁺; median realised TV)"]
    for sch in schemes:
        med = {c: [] for c in configs}
        real = []
        for i in range(steps):
            q, k, sigma = make_step(np.random.default_rng([seed, n, i]), n, d)
            for t, g in configs:
                r = meter_step(q, k, sigma, sch, B.group_slices(d, g), seed=i, block_size=t)
                med[(t, g)].append(min(r.tanh, r.eform, r.tilt))
            real.append(r.realised_tv)
        lines.append(f"{sch:<16}" + "".join(f"{np.median(med[c]):>14.4f}" for c in configs) + f"   {np.median(real):.2e}")
    wb = [(g + 2) * 2 if t == 1 else (g + 2) * 4 / 16 for t, g in configs]
    lines.append(f"{'witness B/token':<16}" + "".join(f"{b:>14.3f}" for b in wb) + "   (fp16 per token, fp32 per block; K+V)")
    return "\n".join(lines)
