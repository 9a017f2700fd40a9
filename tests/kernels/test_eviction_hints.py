"""The decode pass's L2 eviction hints (``kernels.plan.KV_EVICT`` / ``PARTIALS_EVICT``): hints only, so a pass with
them gives the same outputs and record bit for bit; a setting Triton does not know is refused before any launch,
naming the setting; and the sm_90 code carries them where asked (the code tiles' loads, the partials' stores) and
nowhere by default.

* any device: the refusal; the outputs and record with hints against without (the interpreter takes the hint and
  ignores it; the GPU compiles another binary);
* offline (Triton's bundled ptxas, no GPU): the PTX of the metered fp8 CSR kernel (SGLang's) with and without."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

DEV = os.environ.get("WITCERT_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu]
if DEV == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton is imported"

import kernels.plan as kp  # noqa: E402
from kernels.decode import decode  # noqa: E402
from tests.helpers.conformance import build, to_cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = ("tv_upper_a", "out_err_upper", "xi", "eps_max", "flag")


@pytest.mark.parametrize("name", ["KV_EVICT", "PARTIALS_EVICT"])
def test_an_unknown_policy_is_refused_before_any_launch(name, monkeypatch):
    cache, bt, _ = build("int8", [20], 1, 64, seed=3)
    monkeypatch.setattr(kp, name, "evict_sometimes")
    with pytest.raises(ValueError, match=f"kernels.plan.{name} = 'evict_sometimes'"):
        # (a bf16 query on the GPU, whose path refuses a float32 one before this check)
        decode(cache, torch.randn(1, 2, 64).to(DEV, torch.bfloat16 if DEV == "cuda" else torch.float32), bt.to(DEV),
               torch.tensor([20]).to(DEV))
    monkeypatch.setattr(kp, name, "")
    assert kp.eviction_hints()[name] == ""


@pytest.mark.parametrize("scheme", ["int8", "fp8_e4m3"])
def test_the_hints_change_no_value(scheme, monkeypatch):
    lens = [37, 130]
    cache, bt, _ = build(scheme, lens, 2, 64, seed=5, outliers=True)
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    q = q.to(DEV) if DEV == "cuda" else q.float()

    def run(kv, parts):
        monkeypatch.setattr(kp, "KV_EVICT", kv)
        monkeypatch.setattr(kp, "PARTIALS_EVICT", parts)
        return to_cpu(decode(cache, q, bt.to(DEV), torch.tensor(lens).to(DEV), num_splits=3, tilt_above=-1.0))

    a, b = run("", ""), run("evict_first", "evict_last")
    assert torch.equal(a.o, b.o) and torch.equal(a.lse, b.lse)
    for f in FIELDS:
        x, y = getattr(a.meter, f), getattr(b.meter, f)
        assert torch.equal(x, y), f
    assert not bool(a.meter.flag.any())  # (a real record, not a saturated one on both sides)


_PTX = r"""
import sys
sys.path.insert(0, "bench")
import sass_probe
for kv, parts in (("", ""), ("evict_first", "evict_last")):
    ptx = sass_probe.compile_decode(True, 128, 1, 4, "fp8_e4m3", 168, T=1, PAGES=128, CSR=True, PREFETCH_BT=True,
                                    KV_EVICT=kv, PARTIALS_EVICT=parts).asm["ptx"]
    print("BEGIN", kv or "-", parts or "-")
    print(ptx)
"""


def _tools() -> bool:
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return all(os.path.exists(os.path.join(bin_dir, t)) or shutil.which(t) for t in ("ptxas",))


@pytest.mark.skipif(DEV == "cuda" or not _tools(), reason="offline sm_90 compile (Triton's bundled ptxas)")
def test_the_sm90_code_carries_the_hints_where_asked():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _PTX], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    parts = re.split(r"^BEGIN (\S+) (\S+)$", r.stdout, flags=re.M)
    ptx = {(parts[i], parts[i + 1]): parts[i + 2] for i in range(1, len(parts), 3)}
    plain, hinted = ptx["-", "-"], ptx["evict_first", "evict_last"]
    assert "cache_hint" not in plain and "createpolicy" not in plain
    # the K and V code tiles: 128 tokens × 128 bytes each, loaded 16 bytes a thread by 4 warps: 8 vector loads a
    # thread per tile, each with an evict_first L2 policy; no other load takes one
    lines = [re.sub(r"^@%p\d+\s+", "", ln.strip()) for ln in hinted.splitlines()]
    first = [ln for ln in lines if ln.startswith("ld.global.L1::evict_first.L2::cache_hint.v4.b32")]
    assert len(first) == 2 * (128 * 128) // (4 * 32 * 16), len(first)
    assert len([ln for ln in lines if ln.startswith("ld.global") and "cache_hint" in ln]) == len(first)
    # the partials (m, l, acc, histogram, statistics): every store of the pass, each with an evict_last policy
    stores = [ln for ln in lines if ln.startswith("st.global")]
    plain_stores = [ln for ln in plain.splitlines() if re.search(r"\bst\.global", ln)]
    assert stores and len(stores) == len(plain_stores)
    assert all(ln.startswith("st.global.L1::evict_last.L2::cache_hint") for ln in stores), stores
    assert "createpolicy.fractional.L2::evict_first" in hinted and "createpolicy.fractional.L2::evict_last" in hinted
