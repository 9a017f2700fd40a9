"""Run bench/sglang_h200.py with one scheme's metered tile forced: FORCE_TILE=scheme,tokens,stages,warps,head_columns,cap,prefetch
(cap 0: none). The other schemes and the unmetered tiles keep kernels.plan.tile_config's."""
import os, sys, runpy
sys.path.insert(0, os.getcwd())
import kernels.plan as P
from kernels.plan import Tile
f = os.environ["FORCE_TILE"].split(",")
sch = f[0]
t, s, w, hc, cap, pf = map(int, f[1:])
T = Tile(t, s, w, cap or None, head_columns=hc, prefetch=pf)
orig = P.tile_config
def tc(meter, scheme="int8", programs_per_sm=0.0, levels="token", block_size=16):
    if scheme == sch and meter and levels == "token":
        return T
    return orig(meter, scheme, programs_per_sm, levels, block_size)
P.tile_config = tc
print(f"# {sch}'s metered tile forced: {T}", flush=True)
sys.argv = ["bench/sglang_h200.py"] + sys.argv[1:]
runpy.run_path("bench/sglang_h200.py", run_name="__main__")
