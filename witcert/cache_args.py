"""The checks of ``WitCertCache``'s constructor arguments (witcert.cache), one per group of arguments, in the
order the constructor runs them: the request's gate, witness layout and Tier B budget; the seed; the sketch
radius's defaults and channel weights; the backend; the kernel path's options; the layer sweep; CUDA graphs;
the host pool. Each raises ``ValueError`` naming the argument (the messages of the constructor before it was
split, issue 34); none reads or writes the cache."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from contract.schemes import BLOCK_SCHEMES, KERNEL_SCHEME_IDS, SCHEMES
from contract.sketch import DEFAULT_SKETCH_BITS, SKETCH_BOXES

from . import bounds as B
from .cache_kernel import _kernel_scheme
from .gate import Gate
from .hostpool import HostPool

log = logging.getLogger("witcert.cache")


def check_request_args(scheme: str, gate, meter, block_size, witness, schedule, delta_req, horizon, L: int, Hq: int):
    """The gate (a ``Gate``, with the meter on; Tier B gates need ``delta_req``), the witness layout
    (``block_size`` a power of two, ``witness``) and the Tier B budget (``delta_req`` for ``int8_dither``,
    ``schedule`` "fixed" with a ``horizon`` or "anytime")."""
    if gate is not None and not isinstance(gate, Gate):
        raise ValueError(f"gate: expected a witcert.cache.Gate, got {type(gate).__name__}")
    if gate is not None and not meter:
        raise ValueError("gate: gating needs the meter (meter=True)")
    if not isinstance(block_size, int) or block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size: expected a power of two, got {block_size!r}")
    if witness not in ("token", "block"):
        raise ValueError(f"witness: expected 'token' or 'block', got {witness!r}")
    if schedule not in ("fixed", "anytime"):
        raise ValueError(f"schedule: expected 'fixed' or 'anytime', got {schedule!r}")
    if delta_req is not None:
        if scheme != "int8_dither":
            raise ValueError("delta_req: Tier B (SPEC §5) is defined for the int8_dither scheme only")
        if schedule == "fixed" and horizon is None:
            raise ValueError("schedule 'fixed' needs horizon= (the maximum number of decode steps)")
        B.step_budget(delta_req, L, Hq, **({"horizon": horizon} if schedule == "fixed" else {"step": 1}))
    if gate is not None and gate.tier == "B" and delta_req is None:
        raise ValueError("Gate(tier='B') needs delta_req (Tier B budget)")


def check_seed(seed) -> None:
    """``seed``: an int in [0, 2^32) (the dither's key for every request) or None (fresh per request)."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32):
        raise ValueError(f"seed: expected an int in [0, 2^32) or None (fresh per request), got {seed!r}")


def default_sketch_bits(sketch_bits, scheme: str, num_groups: int, witness: str):
    """``sketch_bits``, or where None the scheme table's default (user schemes: the library's); none with
    G > 1 groups or block witnesses. Not yet checked (``contract.sketch.check_bits``)."""
    if sketch_bits is None:  # the scheme table's default (user schemes: the library's); none with G > 1 / blocks
        grouped = num_groups != 1 or witness != "token"
        sketch_bits = 0 if grouped else (SCHEMES[scheme].default_sketch_bits if scheme in SCHEMES
                                         else DEFAULT_SKETCH_BITS)
    return sketch_bits


def _check_cache_weights(weights, L: int, Hkv: int, D: int, scheme: str):
    """The sketch radius's channel weights as a float64 [L, Hkv, D] array of powers of two, or None
    (all 1): from a ``witcert.calibrate.Calibration`` or an array of that shape."""
    if weights is None:
        return None
    from .calibrate import Calibration, check_weights

    if isinstance(weights, Calibration):
        if weights.scheme != scheme:
            log.warning("weights: calibrated for scheme %s, used with %s (sound with any weights; maybe looser)",
                        weights.scheme, scheme)
        weights = weights.weights
    w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.shape != (L, Hkv, D):
        raise ValueError(f"weights: expected [{L} layers, {Hkv} kv heads, {D}] for this model, got shape {w.shape}")
    check_weights(w)
    return w


def check_sketch_layout(sketch: bool, num_groups: int, witness: str) -> None:
    """The sketch radius (a sketch or channel weights) takes one per-token witness."""
    if sketch and (num_groups != 1 or witness != "token"):
        raise ValueError("sketch_bits / weights: the sketch radius takes one per-token witness (num_groups=1, "
                         "witness='token'); pass sketch_bits=0, weights=None for grouped or block witnesses")


_LOGGED_BOX: list = []  # the "auto" box decision, logged once per process and scheme


def check_sketch_box(sketch_box, backend, sketch_bits: int, scheme: str) -> str:
    """``sketch_box`` (``WitCertCache``): "centred" and "grid" need the reference path (the kernels bin the symmetric
    box) and a sketch (without one the centre is 0: the same bound); "per-head" (each query head's own symmetric
    radius, c_h W_j + |σ⟨q_h, r̃_j⟩|: one key level per (token, head) in the kernels) runs on both paths;
    "auto" is logged when it matters."""
    if sketch_box not in SKETCH_BOXES:
        raise ValueError(f"sketch_box: expected one of {SKETCH_BOXES}, got {sketch_box!r}")
    if sketch_box in ("centred", "grid") and backend != "reference":
        raise ValueError(f"sketch_box={sketch_box!r}: the kernels bin the symmetric sketch box |δ| ≤ c_h (W + u); the "
                         "centred box (on levels, or unbinned on the fixed grid) is metered on the reference path only "
                         "(backend='reference'), or pass sketch_box='auto'")
    if sketch_box == "auto" and sketch_bits and backend != "reference" and scheme not in _LOGGED_BOX:
        _LOGGED_BOX.append(scheme)  # once per process and scheme
        row = SCHEMES.get(scheme)
        kern = "per-head" if row is not None and row.kernel_head_levels else "symmetric"
        log.info("sketch_box auto (%s): the reference path meters the centred sketch box, the kernel path the %s "
                 "one (its bins); the bounds differ between the backends", scheme, kern)
    return sketch_box


def check_backend(backend, scheme: str, D: int, num_groups: int, witness: str, block_size: int, Hq: int, Hkv: int):
    """``backend``: "auto", "reference" or "kernel"; "kernel" only where the kernels serve this cache (a
    device or the interpreter, a kernel scheme, the head dim, G = 1 per-token witnesses, T = 16, the GQA
    group), with every reason it does not in the message."""
    if backend not in ("auto", "reference", "kernel"):
        raise ValueError(f"backend: expected 'auto', 'reference' or 'kernel', got {backend!r}")
    if backend == "kernel":
        from kernels.paged import SUPPORTED_HEAD_DIMS

        why = []
        from kernels import interpret as _kw

        if not torch.cuda.is_available() and not _kw.INTERPRET:
            why.append("no CUDA device, and Triton's interpreter is off (set TRITON_INTERPRET=1 before importing "
                       "triton to run the kernels on the CPU, slowly)")
        if not _kernel_scheme(scheme):
            why.append(f"scheme {scheme!r} has no kernel (kernel schemes: "
                       f"{sorted(n for n in KERNEL_SCHEME_IDS if _kernel_scheme(n))})")
        if D not in SUPPORTED_HEAD_DIMS:
            why.append(f"head_dim {D} is not supported by the kernels {SUPPORTED_HEAD_DIMS}")
        if num_groups != 1 or witness != "token" or block_size != 16:
            why.append("the kernel path serves caches with G = 1 per-token witnesses, T = 16")
        if not 1 <= Hq // Hkv <= 8:
            why.append(f"GQA group {Hq // Hkv} is outside the kernels' 1..8")
        if why:
            raise ValueError("backend='kernel': " + "; ".join(why))


def check_tilt_above(tilt_above) -> float:
    """The kernel path's ``tilt_above`` as a float (None: -1, the tilt on every row)."""
    if tilt_above is not None and not (isinstance(tilt_above, (int, float)) and math.isfinite(tilt_above)):
        raise ValueError(f"tilt_above: expected a finite number or None, got {tilt_above!r}")
    # (kernels.decode's tilt_above: rows whose closed-form TV⁺ is ≤ it skip the dual-grid tilt
    # and report tilt 1, rows whose coarse grid settles it skip the refinement; TV⁺ stays sound;
    # None: the tilt on every row, refined)
    return -1.0 if tilt_above is None else float(tilt_above)


def check_compress_layers(compress_layers, L: int):
    """``compress_layers`` as a frozenset of layer indices in [0, L), or None (every layer)."""
    if compress_layers is not None:
        compress_layers = frozenset(compress_layers)
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < L for i in compress_layers):
            raise ValueError(f"compress_layers: expected layer indices in [0, {L}), got {sorted(compress_layers)!r}")
    return compress_layers


def check_cuda_graph(cuda_graph, *, backend, scheme: str, gate, delta_req, audit, compress_layers, meter: bool) -> None:
    """``cuda_graph``: a bool; True only for what a captured step serves (the kernel path, a per-token kernel
    scheme, no gate, no Tier B, no audit, every layer compressed, the meter on), every reason in the message."""
    if not isinstance(cuda_graph, bool):
        raise ValueError(f"cuda_graph: expected True or False, got {cuda_graph!r}")
    if cuda_graph:
        why = [reason for bad, reason in (
            (backend == "reference", "backend='reference' (graphs replay the kernel path)"),
            (not _kernel_scheme(scheme) or scheme in BLOCK_SCHEMES,
             f"scheme {scheme!r} (graphed: the per-token kernel schemes "
             f"{sorted(n for n in KERNEL_SCHEME_IDS if _kernel_scheme(n) and n not in BLOCK_SCHEMES)}; a block "
             "scheme holds its partial page on the host's schedule)"),
            (gate is not None, "a gate (it decides page-ins on the host every step)"),
            (delta_req is not None, "delta_req (Tier B's budget changes every step)"),
            (audit, "audit=True (the float64 reference path)"),
            (compress_layers is not None, "compress_layers (its exact layers grow by concatenation)"),
            (not meter, "meter=False"),
        ) if bad]
        if why:
            raise ValueError("cuda_graph=True does not serve: " + "; ".join(why))


def check_defer_tilt(defer_tilt, cuda_graph: bool):
    """``defer_tilt``: None (the default: on for a graphed step on a CUDA device, ``defers_tilt``), True or False;
    True only with ``cuda_graph=True`` (the step's end, where one launch finishes every layer's tilt, is the
    captured step's; ``kernels.tilt_batch``). Returns it."""
    if defer_tilt is not None and not isinstance(defer_tilt, bool):
        raise ValueError(f"defer_tilt: expected None, True or False, got {defer_tilt!r}")
    if defer_tilt and not cuda_graph:
        raise ValueError("defer_tilt=True: graphed decode steps only (pass cuda_graph=True); the eager kernel path "
                         "runs each layer's tilt in its own merge")
    return defer_tilt


def defers_tilt(defer_tilt, cuda_graph: bool, device) -> bool:
    """Does a graphed step on ``device`` finish its layers' tilt in one launch? ``defer_tilt`` None: on a CUDA device
    (bench/RESULTS.md run V: the same records, the full meter's graphed Llama-8B step 11.67 → 10.44 ms at B 1 / 4K),
    not elsewhere (off the GPU the graphed step is a test vehicle whose merge is the torch twin, as the eager path's;
    ``defer_tilt=True`` runs the deferred form there too)."""
    if not cuda_graph:
        return False
    return torch.device(device).type == "cuda" if defer_tilt is None else bool(defer_tilt)


def check_host_pool(host_pool) -> None:
    """``host_pool``: None, False or a ``HostPool``."""
    if host_pool is not None and host_pool is not False and not isinstance(host_pool, HostPool):
        raise ValueError(f"host_pool: expected None, False or a witcert.hostpool.HostPool, got {host_pool!r}")
