"""Programmatic dependent launch (``kernels.pdl``): where it is taken, the sm_90 code of the two kernels that wait
(``griddepcontrol.wait`` before their first global access; the decode's ``launch_dependents`` after it), and on a
GPU the decode call with PDL against the same call without it, bit for bit, eager and replayed from a CUDA graph."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import kernels.pdl as pdl
from tests.kernels.test_kernel_codegen import ROOT, _tools

DEV = os.environ.get("WITCERT_DEVICE", "cpu")


def test_no_pdl_off_the_gpu_or_without_launches(monkeypatch):
    assert pdl.pdl_launch("cpu", "merge") == {} and pdl.pdl_launch("cpu", "decode") == {}
    assert not pdl.gdc("cpu")
    monkeypatch.setattr(pdl, "PDL_LAUNCHES", ())
    assert not pdl.gdc("cuda")  # (no device query: no launch takes PDL)
    with pytest.raises(ValueError, match="op is one of"):
        pdl.pdl_launch("cpu", "write")


def _pdl_device(monkeypatch):
    """A device where ``gdc`` holds without a GPU: cuda:0 of sm_90, outside the interpreter, no refusal yet."""
    monkeypatch.setattr(pdl, "INTERPRET", False)
    monkeypatch.setattr(pdl, "_sm90", lambda index: True)
    monkeypatch.setattr(pdl, "_REFUSED", set())
    monkeypatch.setattr(pdl, "PDL_LAUNCHES", ("merge", "decode"))
    assert pdl.gdc("cuda:0") and pdl.pdl_launch("cuda:0", "decode") == {"launch_pdl": True}


def test_a_launch_refused_with_pdl_runs_without_it_and_pdl_stays_off(monkeypatch, caplog):
    """``pdl_call``: a driver or context that refuses programmatic stream serialization (Triton's launcher raises) gets
    the launch again without PDL, and PDL off on that device from then on (``gdc`` false, no launch keyword), logged."""
    _pdl_device(monkeypatch)
    seen = []

    def launch(kw):
        seen.append(dict(kw))
        if kw.get("launch_pdl"):
            raise RuntimeError("Triton Error [CUDA]: operation not supported")
        return "ran"

    with caplog.at_level("WARNING", logger="witcert.kernels"):
        assert pdl.pdl_call("cuda:0", "decode", launch) == "ran"
    assert seen == [{"launch_pdl": True}, {}] and "PDL is off" in caplog.text
    assert not pdl.gdc("cuda:0") and pdl.pdl_launch("cuda:0", "merge") == {}
    seen.clear()
    assert pdl.pdl_call("cuda:0", "merge", launch) == "ran" and seen == [{}]  # (no second try: PDL is off there)
    assert pdl.gdc("cuda:1")  # (another device keeps it)


def test_a_launch_that_fails_without_pdl_too_raises_its_first_error(monkeypatch):
    """A fault that is not PDL's (the launch fails both ways) raises the first error and leaves PDL on; a tile that does
    not fit (``OutOfResources``, the decode's own retry) passes through at once, launched once."""
    from triton.runtime.errors import OutOfResources

    _pdl_device(monkeypatch)
    calls = []

    def bad(kw):
        calls.append(dict(kw))
        raise RuntimeError("first" if kw else "second")

    with pytest.raises(RuntimeError, match="^first$"):
        pdl.pdl_call("cuda:0", "merge", bad)
    assert calls == [{"launch_pdl": True}, {}] and pdl.gdc("cuda:0")
    calls.clear()

    def big(kw):
        calls.append(dict(kw))
        raise OutOfResources(300000, 232448, "shared memory")

    with pytest.raises(OutOfResources):
        pdl.pdl_call("cuda:0", "decode", big)
    assert calls == [{"launch_pdl": True}] and pdl.gdc("cuda:0")


def test_both_launches_go_through_pdl_call(monkeypatch):
    """The decode pass and its merge launch through ``pdl_call`` (so a refusal falls back for either)."""
    import kernels.decode as Dk
    import kernels.epilogue as E
    from tests.helpers.conformance import build

    ops = []

    def spy(device, op, launch):
        ops.append(op)
        return pdl.pdl_call(device, op, launch)

    monkeypatch.setattr(Dk, "pdl_call", spy)
    monkeypatch.setattr(E, "pdl_call", spy)
    monkeypatch.setattr(Dk, "MERGE_OFF_GPU", "kernel")
    cache, bt, _ = build("int8", [20], 1, 64, seed=3)
    Dk.decode(cache, torch.randn(1, 2, 64).bfloat16().float().to(DEV), bt.to(DEV), torch.tensor([20]).to(DEV))
    assert ops == ["decode", "merge"]


_CODEGEN = r"""
import re, sys
sys.path.insert(0, "bench")
import sass_probe
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton
from kernels import epilogue as E, epilogue_jit as EJ
from tests.helpers.epilogue_codegen import _merge_meter_kernel

def first(ptx, pat):
    m = re.search(pat, ptx)
    return m.start() if m else -1

for gdc in (False, True):
    dec = sass_probe.compile_decode(True, 128, 1, GDC=gdc).asm["ptx"]
    fn, sig, const = _merge_meter_kernel(E, EJ)
    mer = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const | {"GDC": gdc}),
                         target=GPUTarget("cuda", 90, 64), options={"num_warps": 4}).asm["ptx"]
    for name, ptx in (("decode", dec), ("merge", mer)):
        print(name, gdc, first(ptx, r"griddepcontrol\.wait"), first(ptx, r"griddepcontrol\.launch_dependents"),
              first(ptx, r"\b(ld|st)\.global"))
"""


@pytest.mark.skipif(not _tools(), reason="Triton's bundled ptxas / nvdisasm not installed")
def test_the_waiting_kernels_wait_before_their_first_global_access():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _CODEGEN], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {(ln.split()[0], ln.split()[1]): [int(x) for x in ln.split()[2:]] for ln in r.stdout.splitlines()}
    for name in ("decode", "merge"):
        wait, launch, mem = got[name, "False"]
        assert wait == launch == -1 and mem > 0  # GDC off: no grid dependency control
        wait, launch, mem = got[name, "True"]
        assert 0 <= wait < mem, (name, wait, mem)
        if name == "decode":  # the decode lets the merge's programs be placed, after its own wait (before its stores)
            assert wait < launch
        else:
            assert launch == -1


@pytest.mark.gpu
@pytest.mark.skipif(DEV == "cpu", reason="PDL needs a CUDA GPU of compute capability 9.0 or more")
@pytest.mark.parametrize("case", ["off", "group", "default"])
def test_pdl_changes_no_value(case, monkeypatch):
    monkeypatch.setattr(pdl, "PDL_LAUNCHES", ("merge", "decode"))
    if not pdl.gdc(DEV):
        pytest.skip("this GPU has no griddepcontrol (compute capability < 9.0)")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from decode import capture, fill_cache
    from sketch_speed import page_norms, random_window, sketched

    from kernels.decode import decode

    torch.manual_seed(0)
    B, n, Hq, Hkv, D = 3, 5000, 32, 8, 128
    c, bt = fill_cache(B, n, Hkv, D, "int8", DEV)
    q = torch.randn(B, Hq, D, device=DEV, dtype=torch.bfloat16)
    sl = torch.tensor([n, 17, 4093], device=DEV, dtype=torch.int32)
    win = None
    if case == "default":
        c = page_norms(sketched(c, 2, True, torch.Generator().manual_seed(0)))
        win = random_window(B, Hkv, D, 4, 32, DEV)

    def call():
        return decode(c, q, bt, sl, meter=case != "off", validate=False, window=win, tilt_above=-1.0)

    def fields(out):  # the output, the log-sum-exp and every tensor of the record
        rec = out.meter
        vals = [out.o, out.lse]
        if rec is not None:
            vals += [getattr(rec, f.name) for f in dataclasses.fields(rec) if getattr(rec, f.name) is not None]
        assert case == "off" or len(vals) > 10
        return [v.clone() for v in vals]

    def graphed():
        g, out = capture(call)
        g.replay()
        torch.cuda.synchronize()
        return fields(out)

    got = {}
    for launches in ((), ("merge",), ("merge", "decode")):
        monkeypatch.setattr(pdl, "PDL_LAUNCHES", launches)
        got[launches] = (fields(call()), graphed())
    base = got[()]
    for launches, (eager, replay) in got.items():
        for a, b in zip(eager + replay, base[0] + base[1]):
            assert torch.equal(a, b), launches
