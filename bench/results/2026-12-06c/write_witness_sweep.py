"""Run B5's sweep (2026-12-06, seventeenth session): every stored witness of the write kernel against the stored
codes, per token, over schemes × head dims × groups × per-token / per-block witnesses × outlier keys (the conformance
builder's two-launch writes). Counts, per configuration, the tokens whose κ < ‖k̂‖, ν < ‖v̂‖, φ < ‖v̂ − v‖ or a group
witness below its group's residual norm."""
import itertools
import sys

import torch

sys.path.insert(0, ".")
from tests.helpers.conformance import build, dequant, on_cpu  # noqa: E402
from witcert import bounds as B  # noqa: E402

total = bad_total = 0
for scheme, D, G, per_token, outl in itertools.product(
        sys.argv[1].split(",") if len(sys.argv) > 1 else
        ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int8", "int8_dither", "int4_group", "kivi2"),
        (64, 128, 256), (1, 2), (True, False), (True, False)):
    if scheme == "kivi2" and D == 256 and G == 2:
        continue
    lens = [33, 70]
    try:
        cache, bt, exact = build(scheme, lens, 2, D, G=G, per_token=per_token, seed=D + G, outliers=outl)
    except Exception as exc:  # noqa: BLE001
        print(f"{scheme} D{D} G{G} pt{int(per_token)} o{int(outl)} ERROR {type(exc).__name__}: {str(exc)[:120]}")
        continue
    cache = on_cpu(cache)
    T = cache.block_size
    bad = n_all = 0
    for b, n in enumerate(lens):
        j = torch.arange(n)
        blk = bt[b, j // T].long()
        off = (j % T) if per_token else torch.zeros_like(j)
        for h in range(2):
            kh, vh = dequant(cache, bt, b, n, h)
            kx, vx = (t[:, h].double() for t in exact[b])
            W = cache.k_wit[blk, h, off].double()
            phi, nu, kap = (t[blk, h, off].double() for t in (cache.v_wit, cache.v_norm, cache.k_norm))
            # (per block: the page's running maxima, compared with each token's)
            ok = (kap >= kh.norm(dim=-1)) & (nu >= vh.norm(dim=-1)) & (phi >= (vh - vx).norm(dim=-1))
            if cache.sketch_bits == 0 and not cache.has_weights:
                ok &= torch.all(W >= B.group_norms(kh - kx, cache.groups()), dim=-1)
            bad += int((~ok).sum())
            n_all += n
    total += n_all
    bad_total += bad
    if bad:
        print(f"{scheme} D{D} G{G} pt{int(per_token)} o{int(outl)}: {bad} of {n_all} tokens short")
print(f"## {bad_total} short of {total} tokens")
