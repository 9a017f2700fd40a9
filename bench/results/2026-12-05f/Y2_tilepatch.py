"""Run bench/sglang_h200.py with scheme none's tile forced (NONE_TILE=tokens,stages,warps,head_columns)."""
import os, sys, runpy
sys.path.insert(0, os.getcwd())
import kernels.plan as P
from kernels.plan import Tile
t, s, w, hc = map(int, os.environ["NONE_TILE"].split(","))
orig = P.tile_config
def tc(meter, scheme="int8", programs_per_sm=0.0, levels="token", block_size=16):
    if scheme == "none" and not (meter and levels == "page"):
        return Tile(t, s, w, head_columns=hc)
    return orig(meter, scheme, programs_per_sm, levels, block_size)
P.tile_config = tc
print(f"# scheme none's tile forced: {Tile(t, s, w, head_columns=hc)}", flush=True)
sys.argv = ["bench/sglang_h200.py"] + sys.argv[1:]
runpy.run_path("bench/sglang_h200.py", run_name="__main__")
