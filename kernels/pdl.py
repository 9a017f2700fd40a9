"""Programmatic dependent launch (PDL, CUDA sm_90 and later) for the decode's two launches.

    PDL_LAUNCHES            the launches that take PDL: "merge" (the fused merge after the decode pass), "decode"
                            (the decode pass after whatever the stream ran before it); a benchmark empties it
    gdc(device)             whether the kernels' grid dependency control instructions run there (the kernels'
                            ``GDC`` constexpr: CUDA, capability ≥ 9.0, not Triton's interpreter)
    pdl_launch(device, op)  the launch keywords of ``op`` (``{"launch_pdl": True}`` or ``{}``)
    pdl_call(device, op, launch)
                            ``launch(keywords)`` with ``pdl_launch``'s keywords; a launch refused with PDL on (a driver
                            or context without programmatic stream serialization) is retried without it, and PDL stays
                            off on that device (logged)

A kernel launched with PDL may start while the kernel before it in the stream is still running; its
``griddepcontrol.wait`` (Triton's ``gdc_wait``) then blocks until that kernel has completed and its memory
operations are visible. Both kernels execute it before their first load and store (``_decode_kernel``,
``epilogue_jit._merge_meter_kernel``), so what they read and write is what a plain launch gives, bit for bit
(``tests/kernels/test_pdl.py``); what PDL saves is the dependent launch's latency. The decode pass signals
(``gdc_launch_dependents``) before it stores its partials, so the merge's programs are placed on the multiprocessors
once every decode program has signalled or exited (they wait there for the pass to complete); a signal at the decode's
start made the default sketch call 13 % slower at B 1 / 4K (run P1; not profiled: likely the merge's waiting programs beside the decode's).
Without PDL both instructions are no-ops (PTX ``griddepcontrol``). Timed in bench/RESULTS.md, run P1
(``bench/pdl_ab.py``): 0.4-3 % less time per call at B 1, none lost at B 8 (nor at B 32 in P1's first form).
"""

from __future__ import annotations

import functools
import logging

import torch
from triton.runtime.errors import OutOfResources

from .interpret import INTERPRET

log = logging.getLogger("witcert.kernels")
_LOGGED: set = set()

#: the launches that take PDL where ``gdc`` holds ("merge", "decode"); read at each launch (a benchmark empties it)
PDL_LAUNCHES: tuple[str, ...] = ("merge", "decode")
#: the launches this module knows
_OPS = ("merge", "decode")


#: devices (their indices) where a launch with PDL failed and one without it succeeded: PDL stays off there
_REFUSED: set = set()


def gdc(device) -> bool:
    """Whether the kernels execute ``griddepcontrol`` on ``device`` (their ``GDC``): NVIDIA CUDA with compute capability
    ≥ 9.0, outside Triton's interpreter (which has no inline PTX), while some launch takes PDL and the device has not
    refused one (``pdl_call``)."""
    dev = torch.device(device)
    if INTERPRET or dev.type != "cuda" or not PDL_LAUNCHES:
        return False
    index = _index(dev)
    return index not in _REFUSED and _sm90(index)


def _index(dev: torch.device) -> int:
    """A CUDA device's index (the current device's where none is given)."""
    return dev.index if dev.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _sm90(index: int) -> bool:
    # (ROCm reports its own architectures as capability 9.x: no PTX there)
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(device, op: str) -> dict:
    """The launch keywords of ``op`` ("merge" or "decode") on ``device``: ``launch_pdl`` where ``gdc(device)`` and
    ``op`` is in ``PDL_LAUNCHES`` (logged once per device and setting), else none."""
    if op not in _OPS:
        raise ValueError(f"pdl_launch: op is one of {_OPS}, got {op!r}")
    on = op in PDL_LAUNCHES and gdc(device)
    key = (str(device), op, on)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("decode: the %s launch %s programmatic dependent launch on %s", op, "takes" if on else "does not take",
                 device)
    return {"launch_pdl": True} if on else {}


def pdl_call(device, op: str, launch):
    """``launch(keywords)`` with ``pdl_launch(device, op)``'s keywords. Where that launch raises with PDL on (a driver or
    context that refuses programmatic stream serialization: Triton's launcher raises a RuntimeError), it is launched
    again without PDL; if that succeeds, PDL stays off on the device (``gdc`` false: later variants compile without the
    grid dependency instructions, which are no-ops without PDL anyway), logged once. If it fails too, the device keeps
    PDL and the first error is raised (the fault was not PDL's). ``OutOfResources`` (a tile that does not fit: the
    caller's retry) passes through at once."""
    kw = pdl_launch(device, op)
    if not kw:
        return launch({})
    try:
        return launch(kw)
    except OutOfResources:
        raise
    except RuntimeError as first:
        try:
            out = launch({})
        except Exception:
            raise first from None
        _REFUSED.add(_index(torch.device(device)))
        log.warning("decode: the %s launch failed with programmatic dependent launch on %s and ran without it; PDL is "
                    "off on that device from now on (%s: %s)", op, device, type(first).__name__, first)
        return out
