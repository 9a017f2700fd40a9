# The probe behind tight_kernel_int8_coarse_grid.json (2026-12-05, thirteenth session): `witcert tightness --scheme
# int8 --backend kernel --json` with the tilt's REFINE_TOP set to argv[2], run from a worktree of fd5ef7b (argv[1])
# whose kernels/epilogue_torch.tilt_from_hist returned the coarse grid's maximum at REFINE_TOP 0 (what 26d8128
# commits); the suite's interpreter patch only for speed. `python tight_grid_probe.py /tmp/wt_coarse 0 OUT.json`
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
root = sys.argv[1]; rt = int(sys.argv[2]); out = sys.argv[3]
sys.path.insert(0, root)
sys.path.append("/work/main")  # tests.helpers.interpreter_calls (speed only)
from tests.helpers.interpreter_calls import install
install()
import kernels.epilogue_torch as et, kernels.epilogue as ke, kernels.epilogue_jit as ej
et.REFINE_TOP = ke.REFINE_TOP = ej.REFINE_TOP = rt
from witcert.cli import main
sys.argv = ["witcert", "tightness", "--scheme", "int8", "--backend", "kernel", "--json"]
import contextlib, io
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main()
open(out, "w").write(buf.getvalue())
print(buf.getvalue()[-600:])
