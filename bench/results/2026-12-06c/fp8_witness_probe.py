"""Run B3's probe (2026-12-06, seventeenth session): the fp8_e4m3 write's stored witnesses against the norms of the
stored codes, per token, for conformance case FIXED[3] (fp8_e4m3, lens [33, 128], outlier keys). Prints, per token of
sequence 0 / kv head 0: kappa, ||k_hat||, nu, ||v_hat||, phi, ||v_hat - v||, and whether nu or phi is short."""
import sys

import torch

sys.path.insert(0, ".")
from tests.helpers.conformance import build, dequant, stored_witnesses  # noqa: E402

for scheme, lens, hkv, d, outl, seed in (("fp8_e4m3", [33, 128], 2, 128, True, 4),
                                         ("fp8_e4m3", [33, 128], 2, 128, False, 4),
                                         ("fp8_e4m3_scaled", [100], 1, 256, False, 5),
                                         ("fp8_e5m2", [33, 128], 2, 128, True, 4)):
    cache, bt, exact = build(scheme, lens, hkv, d, G=1, per_token=True, seed=seed, outliers=outl)
    cache = type(cache)(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in cache.__dict__.items()})
    bad = 0
    for b, n in enumerate(lens):
        for h in range(hkv):
            kh, vh = dequant(cache, bt, b, n, h)
            kx, vx = (t[:, h].double() for t in exact[b])
            W, phi, nu = stored_witnesses(cache, bt, b, n, h)
            T = cache.block_size
            j = torch.arange(n)
            kap = cache.k_norm[bt[b, j // T].long(), h, j % T].double()
            short = (nu < vh.norm(dim=-1)) | (phi < (vh - vx).norm(dim=-1)) | (kap < kh.norm(dim=-1))
            bad += int(short.sum())
            if b == 0 and h == 0:
                print(f"== {scheme} outliers={outl} seq 0 head 0: j kappa |k^| nu |v^| phi |v^-v| W |k^-k|")
                for t in range(min(n, 40)):
                    print(f"{t:3d} {kap[t]:9.3f} {kh[t].norm():9.3f} {nu[t]:9.3f} {vh[t].norm():9.3f} "
                          f"{phi[t]:9.4f} {(vh[t] - vx[t]).norm():9.4f} {W[t].max():9.4f} {(kh[t] - kx[t]).norm():9.4f}"
                          f"{'  SHORT' if short[t] else ''}")
    print(f"## {scheme} outliers={outl}: {bad} short witnesses")
