"""The WitCert meter inside SGLang, without a fork: an environment-guarded in-process patch.

    import witcert.integrations.sglang as ws
    ws.install()          # patches only when WITCERT_SGLANG=1; returns None and touches nothing otherwise
    ws.install(force=True)                         # explicit: patch regardless of the variable

What is wrapped (the whole list; nothing else is touched), for SGLang ``SUPPORTED_VERSIONS``:

* ``sglang.kernels.ops.attention.decode_attention.decode_attention_fwd`` (module attribute; the
  Triton backend ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend`` binds it in its
  ``__init__``, so ``install()`` must run before the model runner is built);
* ``sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer`` (class attribute; the
  subclasses that do not override it inherit the wrapper).

On another SGLang version, or when either target cannot be imported or does not have the
expected signature, ``install()`` raises ``UnsupportedSGLang`` before patching anything (never a
half patch). ``uninstall()`` restores both originals.

KV write (the pool's set-KV path): for each token written at slot ``loc`` the wrapper keeps the
exact K/V it was handed (before SGLang's in-place division by ``k_scale``), calls SGLang's own
write, reads back what SGLang stored and writes side buffers indexed like SGLang's pool
(``[slot, kv_head, 1, ·]``): per-group key witnesses ``W ≥ ‖(k̂ − k)[g]‖``, ``φ ≥ ‖v̂ − v‖``,
``ν ≥ ‖v̂‖``, ``κ ≥ ‖k̂‖`` (fp64 norms × (1 + 2^-12) + 2^-100, rounded up into float16), with
``k̂ = code · k_scale`` for SGLang's fp8 cache (``--kv-cache-dtype fp8_e4m3``) and ``k̂ = k`` for a
bf16/fp16 cache. With ``scheme=<one of ours>`` the wrapper additionally quantizes the exact K/V
with ``kernels.write.write_kv`` into a WitCert ``PagedKV`` (block size 1, block id = SGLang's
slot), and the decode serves attention from those codes (int8_dither is refused: SGLang's write
path does not carry the token's logical index, the dither key).

Decode: ``kernels.decode.decode`` on SGLang's layout (page size 1: ``kv_indices`` are token
slots, so the per-request "block table" is ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` over
``PagedKV`` views of SGLang's buffers with ``block_size = 1``). It writes SGLang's output tensor
``o`` and puts the merged log-sum-exp in ``attn_lse[:, :, 0]`` (the other splits −inf, so a
caller's ``logsumexp`` over splits is unchanged); the meter record of every (request row, query
head) goes to ``on_record(layer_id, record)`` (default: kept in ``STATE.records``). Calls the
metered kernel cannot serve (page size ≠ 1, MLA, logit cap, sinks, score_mod, xai temperature,
head dims outside 64/128/256, GQA > 8, a buffer no patched write has registered) go to SGLang's
own kernel unmetered and are counted in ``STATE.unmetered`` with the reason.

Not here: the gate (page-in from an exact store: SGLang keeps no exact store; with one of our
schemes the exact copy is in the ``PagedKV`` but nothing pages it in yet), CUDA graphs (the
metered decode syncs with the host), and a test of the real server path (see README "SGLang").
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import math
import os
import sys
import types

import torch

from contract.schemes import SCHEMES

log = logging.getLogger("witcert.sglang")

SUPPORTED_VERSIONS = ("0.5.23",)
ENV = "WITCERT_SGLANG"
DECODE_MODULE = "sglang.kernels.ops.attention.decode_attention"
DECODE_FN = "decode_attention_fwd"
POOL_MODULE = "sglang.srt.mem_cache.memory_pool"
POOL_CLASS = "MHATokenToKVPool"
#: the leading parameters each wrapper relies on (checked on the installed functions)
DECODE_PARAMS = ("q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse",
                 "num_kv_splits", "max_kv_splits", "sm_scale", "k_scale", "v_scale", "logit_cap", "sinks",
                 "xai_temperature_len", "has_mla", "use_pdl", "page_size", "score_mod")
POOL_PARAMS = ("self", "layer", "loc_info", "cache_k", "cache_v", "k_scale", "v_scale")
WITNESS_SLACK = 2.0**-12
WITNESS_FLOOR = 2.0**-100
#: our kernel schemes SGLang can serve: lossy, and not keyed by the token's logical index
#: (SGLang's write does not carry it: int8_dither is refused), from the scheme table
OUR_SCHEMES = tuple(r.name for r in SCHEMES.values() if r.kernel_supported and r.lossy and not r.position_keyed)


class UnsupportedSGLang(RuntimeError):
    """SGLang is missing, of another version, or its targets do not look as expected."""


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def import_bare(module: str, root: str | None = None):
    """Import an SGLang submodule without running ``sglang/__init__.py`` (which needs the
    server's dependencies): only for tests and benchmarks on machines without SGLang's full
    environment. ``root``: the ``sglang`` package folder (default: the installed one)."""
    if "sglang" not in sys.modules:
        if root is None:
            spec = importlib.util.find_spec("sglang")
            if spec is None or spec.origin is None:
                raise UnsupportedSGLang("sglang is not installed (pip install --no-deps sglang==0.5.23)")
            root = os.path.dirname(spec.origin)
        pkg = types.ModuleType("sglang")
        pkg.__path__ = [root]
        pkg.__file__ = os.path.join(root, "__init__.py")
        pkg.__spec__ = importlib.util.spec_from_file_location("sglang", pkg.__file__, submodule_search_locations=[root])
        sys.modules["sglang"] = pkg
    return importlib.import_module(module)


# --------------------------------------------------------------------------- state


@dataclasses.dataclass
class LayerSide:
    """Side buffers of one layer, indexed like SGLang's pool: [slot, kv_head, 1, ·]."""

    layer_id: int
    k_wit: torch.Tensor
    v_wit: torch.Tensor
    v_norm: torch.Tensor
    k_norm: torch.Tensor
    group_id: torch.Tensor
    dtype: torch.dtype  # the pool's logical dtype (its buffers may be stored as uint8)
    ours: object = None  # kernels.paged.PagedKV when a scheme of ours serves the attention


@dataclasses.dataclass
class State:
    scheme: str = "sglang"  # "sglang": meter SGLang's own stored values; else one of OUR_SCHEMES
    num_groups: int = 1
    delta_step: float | None = None
    layers: dict = dataclasses.field(default_factory=dict)  # layer_id -> LayerSide
    by_buffer: dict = dataclasses.field(default_factory=dict)  # k_buffer data_ptr -> layer_id
    records: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=4096))
    unmetered: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    on_record: object = None

    def emit(self, layer_id, rec):
        if self.on_record is not None:
            self.on_record(layer_id, rec)
        else:
            self.records.append((layer_id, rec))


STATE = State()
_ORIGINALS: dict = {}


# --------------------------------------------------------------------------- install


def _check_params(fn, expected, what):
    names = tuple(inspect.signature(fn).parameters)
    if names[: len(expected)] != expected:
        raise UnsupportedSGLang(f"{what}: expected parameters {expected}, found {names[:len(expected)]}; "
                                "this SGLang is not one WitCert's patch was written for")


def _resolve(targets, bare):
    imp = (lambda m: import_bare(m)) if bare else importlib.import_module
    found = {}
    for t in targets:
        try:
            if t == "decode":
                mod = imp(DECODE_MODULE)
                fn = getattr(mod, DECODE_FN)
                _check_params(fn, DECODE_PARAMS, f"{DECODE_MODULE}.{DECODE_FN}")
                found[t] = (mod, DECODE_FN, fn)
            elif t == "pool":
                cls = getattr(imp(POOL_MODULE), POOL_CLASS)
                fn = cls.__dict__["set_kv_buffer"]
                _check_params(fn, POOL_PARAMS, f"{POOL_MODULE}.{POOL_CLASS}.set_kv_buffer")
                found[t] = (cls, "set_kv_buffer", fn)
            else:
                raise ValueError(f"targets: unknown {t!r} (expected 'decode', 'pool')")
        except UnsupportedSGLang:
            raise
        except (ImportError, AttributeError, KeyError) as e:
            raise UnsupportedSGLang(f"cannot resolve the {t!r} target of SGLang: {type(e).__name__}: {e}; "
                                    "nothing was patched") from e
    return found


def install(force: bool = False, scheme: str = "sglang", num_groups: int = 1, delta_step: float | None = None,
            on_record=None, targets=("decode", "pool"), bare: bool = False, version: str | None = None):
    """Patch SGLang when ``WITCERT_SGLANG=1`` (or ``force``); otherwise do nothing, return None.

    Every target is resolved and checked first; only then is anything replaced (all or none).
    ``targets``/``bare`` exist for tests on machines where SGLang's server modules cannot be
    imported; a server uses the defaults. Returns the list of patched ``module.qualname``."""
    if not force and os.environ.get(ENV, "") != "1":
        return None
    ver = sglang_version() if version is None else version
    if ver is None:
        raise UnsupportedSGLang("WitCert's SGLang patch: sglang is not installed; nothing was patched")
    if ver not in SUPPORTED_VERSIONS:
        raise UnsupportedSGLang(f"WitCert's SGLang patch supports sglang {', '.join(SUPPORTED_VERSIONS)}; found "
                                f"{ver}. Nothing was patched (unset {ENV} to serve without the meter).")
    if scheme != "sglang" and scheme not in OUR_SCHEMES:
        raise ValueError(f"scheme: 'sglang' or one of {OUR_SCHEMES}, got {scheme!r}"
                         + (" (int8_dither needs the token's logical index, which SGLang's write path does not carry)"
                            if scheme == "int8_dither" else ""))
    if _ORIGINALS:
        raise RuntimeError("WitCert's SGLang patch is already installed (uninstall() first)")
    found = _resolve(targets, bare)
    STATE.__init__(scheme=scheme, num_groups=num_groups, delta_step=delta_step, on_record=on_record)
    wrappers = {"decode": _wrap_decode, "pool": wrap_set_kv_buffer}
    patched = []
    for t, (owner, name, fn) in found.items():
        _ORIGINALS[t] = (owner, name, fn)
        setattr(owner, name, wrappers[t](fn))
        patched.append(f"{getattr(owner, '__module__', owner.__name__)}.{getattr(owner, '__qualname__', '')}.{name}"
                       if isinstance(owner, type) else f"{owner.__name__}.{name}")
    log.warning("WitCert meter installed in SGLang %s: %s (scheme %s)", ver, ", ".join(patched), scheme)
    return patched


def uninstall():
    for owner, name, fn in _ORIGINALS.values():
        setattr(owner, name, fn)
    _ORIGINALS.clear()


def installed() -> bool:
    return bool(_ORIGINALS)


# --------------------------------------------------------------------------- KV write


def _round_up_f16(x64: torch.Tensor, lossy: torch.Tensor | bool) -> torch.Tensor:
    from witcert import schemes as S

    w = x64 * (1.0 + WITNESS_SLACK)
    w = torch.where(torch.as_tensor(lossy, device=w.device), w + WITNESS_FLOOR, w)
    return S.round_up_to_dtype(w, torch.float16)


def _group_norms64(x: torch.Tensor, gid: torch.Tensor, G: int) -> torch.Tensor:
    sq = torch.zeros(*x.shape[:-1], G, dtype=torch.float64, device=x.device)
    sq.index_add_(x.dim() - 1, gid.long(), x * x)
    return sq.sqrt()


def _side_for(pool_like_buffer: torch.Tensor, layer_id: int, dtype: torch.dtype) -> LayerSide:
    side = STATE.layers.get(layer_id)
    size, H, D = pool_like_buffer.shape[0], pool_like_buffer.shape[-2], pool_like_buffer.shape[-1]
    if side is None or side.k_wit.shape[0] != size:
        from witcert import bounds as B

        dev = pool_like_buffer.device
        gid = torch.empty(D, dtype=torch.int32)
        for g, idx in enumerate(B.group_slices(D, STATE.num_groups)):
            gid[torch.from_numpy(idx)] = g
        f16 = dict(dtype=torch.float16, device=dev)
        side = LayerSide(layer_id, torch.zeros(size, H, 1, STATE.num_groups, **f16), torch.zeros(size, H, 1, **f16),
                         torch.zeros(size, H, 1, **f16), torch.zeros(size, H, 1, **f16), gid.to(dev), dtype)
        if STATE.scheme != "sglang":
            from kernels.paged import PagedKV

            side.ours = PagedKV.allocate(size, H, D, scheme=STATE.scheme, block_size=1, num_groups=STATE.num_groups,
                                         model_dtype=dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16,
                                         device=dev, layer=layer_id)
        STATE.layers[layer_id] = side
    STATE.by_buffer[pool_like_buffer.data_ptr()] = layer_id
    return side


def _as_logical(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return buf.view(dtype) if buf.dtype != dtype and buf.element_size() == torch.empty(0, dtype=dtype).element_size() else buf


#: tokens per float64 chunk of ``record_write`` (a 4M-token write at once needed 32 GiB: bench/SGLANG.md)
RECORD_CHUNK = 1 << 18


def record_write(k_buffer, v_buffer, layer_id, loc, k_exact, v_exact, k_scale=None, v_scale=None, dtype=None):
    """Witnesses of the tokens just written at ``loc`` (SGLang's stored values vs the exact K/V)."""
    dtype = dtype or k_buffer.dtype
    side = _side_for(k_buffer, layer_id, dtype)
    loc = loc.long()
    kb, vb = _as_logical(k_buffer, dtype), _as_logical(v_buffer, dtype)
    ks = 1.0 if k_scale is None else float(k_scale)
    vs = 1.0 if v_scale is None else float(v_scale)
    G = side.k_wit.shape[-1]
    for c0 in range(0, loc.numel(), RECORD_CHUNK):  # float64 copies: bounded memory for long prefills
        lc = loc[c0 : c0 + RECORD_CHUNK]
        kh = kb[lc].double() * ks
        vh = vb[lc].double() * vs
        rk = kh - k_exact[c0 : c0 + RECORD_CHUNK].double()
        rv = vh - v_exact[c0 : c0 + RECORD_CHUNK].double()
        side.k_wit[lc, :, 0] = _round_up_f16(_group_norms64(rk, side.group_id, G), (rk != 0).any(-1, keepdim=True))
        side.v_wit[lc, :, 0] = _round_up_f16(rv.norm(dim=-1), (rv != 0).any(-1))
        side.v_norm[lc, :, 0] = _round_up_f16(vh.norm(dim=-1), False)
        side.k_norm[lc, :, 0] = _round_up_f16(kh.norm(dim=-1), False)
    if side.ours is not None:
        from kernels.write import write_kv

        n = loc.numel()
        # the exact K/V as SGLang gave them (write_kv meters against these, in any float dtype)
        write_kv(side.ours, k_exact, v_exact,
                 loc.to(torch.int32)[:, None], torch.arange(n, device=loc.device),
                 torch.zeros(n, dtype=torch.long, device=loc.device))
    return side


def wrap_set_kv_buffer(orig):
    """Wrapper of ``MHATokenToKVPool.set_kv_buffer`` (see the module doc)."""

    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v, k_scale=None, v_scale=None, *args, **kwargs):
        loc = getattr(loc_info, "loc", loc_info)
        layer_id = kwargs.get("layer_id_override")
        if layer_id is None:
            layer_id = layer.layer_id
        k_exact, v_exact = cache_k.clone(), cache_v.clone()  # SGLang divides by the scale in place
        out = orig(self, layer, loc_info, cache_k, cache_v, k_scale, v_scale, *args, **kwargs)
        try:
            local = layer_id - getattr(self, "start_layer", 0)
            kb, vb = self.k_buffer[local], self.v_buffer[local]
            if kb.dim() == 3 and kwargs.get("dcp_kv_mask") is None:
                record_write(kb, vb, layer_id, loc, k_exact.reshape((-1,) + kb.shape[1:]),
                             v_exact.reshape((-1,) + vb.shape[1:]), k_scale, v_scale, getattr(self, "dtype", None))
            else:
                STATE.unmetered["write: buffer layout not [slot, head, dim]"] += 1
        except Exception as e:  # the meter never breaks a write; the decode of this layer goes unmetered
            STATE.unmetered[f"write: {type(e).__name__}: {e}"] += 1
            STATE.layers.pop(layer_id, None)
        return out

    set_kv_buffer.__wrapped__ = orig
    set_kv_buffer.__witcert__ = True
    return set_kv_buffer


# --------------------------------------------------------------------------- decode


def block_table_from_indptr(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, batch: int):
    """(block_table [B, max_len] int32, seq_lens [B] int32) from SGLang's page-size-1 indices."""
    ip = kv_indptr[: batch + 1].long()
    lens = ip[1:] - ip[:-1]
    mx = max(1, int(lens.max())) if batch else 1
    j = torch.arange(mx, device=kv_indptr.device)
    idx = (ip[:-1, None] + j[None, :]).clamp(max=max(kv_indices.numel() - 1, 0))
    bt = torch.where(j[None, :] < lens[:, None], kv_indices.long()[idx], torch.zeros_like(idx))
    return bt.to(torch.int32), lens.to(torch.int32)


def _unmeterable(args, kwargs):
    q, kb, vb = args[0], args[1], args[2]
    if kwargs.get("page_size", 1) != 1:
        return "page_size != 1"
    if kwargs.get("has_mla"):
        return "MLA"
    if kwargs.get("logit_cap", 0.0):
        return "logit_cap"
    if kwargs.get("sinks") is not None:
        return "sinks"
    if kwargs.get("score_mod") is not None:
        return "score_mod"
    if kwargs.get("xai_temperature_len", -1) not in (-1, None) and kwargs.get("xai_temperature_len", -1) > 0:
        return "xai_temperature_len"
    if kb.dim() != 3 or vb.dim() != 3 or kb.shape[-1] != vb.shape[-1]:
        return "buffer layout"
    if kb.shape[-1] not in (64, 128, 256):
        return f"head_dim {kb.shape[-1]}"
    if q.shape[1] % kb.shape[1] or not 1 <= q.shape[1] // kb.shape[1] <= 8:
        return "GQA group"
    if kb.data_ptr() not in STATE.by_buffer or STATE.by_buffer[kb.data_ptr()] not in STATE.layers:
        return "no patched write registered this buffer"
    return None


_DECODE_NAMES = DECODE_PARAMS + ("aux_tensors", "enable_lean", "lean_Mp", "lean_Lp", "lean_Op", "lean_locks",
                                 "uneven_batch")


def paged_view(side: LayerSide, k_buffer, v_buffer, k_scale, v_scale):
    """A ``PagedKV`` over SGLang's own buffers (block_size 1) and this layer's side buffers."""
    from kernels.paged import PagedKV

    if side.ours is not None:
        return side.ours
    kb, vb = _as_logical(k_buffer, side.dtype), _as_logical(v_buffer, side.dtype)
    if kb.dtype == torch.float8_e4m3fn:
        scheme = "fp8_e4m3"
    elif kb.dtype == torch.float8_e5m2:
        scheme = "fp8_e5m2"
    elif kb.dtype in (torch.bfloat16, torch.float16, torch.float32):
        scheme = "none"
        if float(k_scale) != 1.0 or float(v_scale) != 1.0:
            raise _Skip("k_scale/v_scale != 1 on an unquantized cache")
    else:
        raise _Skip(f"cache dtype {kb.dtype}")
    size, H = kb.shape[0], kb.shape[1]
    f32 = dict(dtype=torch.float32, device=kb.device)
    # per-layer scalar scales, broadcast to [slot, head, 1] with stride 0 (the kernel loads fp32 fine)
    ks = torch.tensor([float(k_scale)], **f32).view(1, 1, 1).expand(size, H, 1)
    vs = torch.tensor([float(v_scale)], **f32).view(1, 1, 1).expand(size, H, 1)
    z = torch.zeros(1, dtype=torch.float16, device=kb.device)
    return PagedKV(scheme=scheme, block_size=1, num_groups=side.k_wit.shape[-1], per_token_witness=True,
                   group_id=side.group_id, k_codes=kb.unsqueeze(2), v_codes=vb.unsqueeze(2), k_scale=ks, v_scale=vs,
                   k_zero=z, v_zero=z, k_wit=side.k_wit, v_wit=side.v_wit, v_norm=side.v_norm, k_norm=side.k_norm,
                   exact_k=torch.zeros(1, dtype=kb.dtype if scheme == "none" else torch.bfloat16, device=kb.device),
                   exact_v=z, seed=0, layer=side.layer_id)


class _Skip(Exception):
    pass


def metered_decode(args, kwargs, num_splits=None):
    """Run the metered kernel on SGLang's arguments; writes ``o`` and ``attn_lse``, returns
    (layer_id, DecodeOutput)."""
    from kernels.decode import decode

    q, kb, vb, o, kv_indptr, kv_indices, attn_logits, attn_lse = args[:8]
    max_kv_splits, sm_scale, k_scale, v_scale = args[9:13]
    layer_id = STATE.by_buffer[kb.data_ptr()]
    side = STATE.layers[layer_id]
    cache = paged_view(side, kb, vb, k_scale, v_scale)
    Bsz = q.shape[0]
    bt, sl = block_table_from_indptr(kv_indptr, kv_indices, Bsz)
    if Bsz == 0 or int(sl.min()) < 1:
        raise _Skip("an empty sequence")
    if num_splits is None:
        num_splits = max(1, min(int(max_kv_splits), math.ceil(int(sl.max()) / 256)))
    out = decode(cache, q, bt, sl, sm_scale=float(sm_scale), num_splits=num_splits, delta_step=STATE.delta_step)
    o.view(Bsz, q.shape[1], -1).copy_(out.o.to(o.dtype))
    attn_lse[:Bsz, : q.shape[1], 0] = out.lse.to(attn_lse.dtype)
    attn_lse[:Bsz, : q.shape[1], 1:] = float("-inf")
    return layer_id, out


def _wrap_decode(orig):
    def decode_attention_fwd(*args, **kwargs):
        # normalise to positional (the first 13) + keywords
        names = _DECODE_NAMES
        args = list(args)
        for i in range(len(args), 13):
            args.append(kwargs.pop(names[i]))
        kw = dict(kwargs)
        for i, a in enumerate(args[13:], start=13):
            kw[names[i]] = a
        why = _unmeterable(args, kw)
        if why is None:
            try:
                layer_id, out = metered_decode(args[:13], kw)
                STATE.emit(layer_id, out.meter)
                return None
            except _Skip as e:
                why = str(e)
        STATE.unmetered[f"decode: {why}"] += 1
        return orig(*args[:13], **kw)

    decode_attention_fwd.__wrapped__ = orig
    decode_attention_fwd.__witcert__ = True
    return decode_attention_fwd


def reduce_tp_records(per_rank: list, dim: int = 1):
    """The records of ranks that each metered a contiguous share of the query heads (SGLang's
    split: rank r holds heads [r·Hq/tp, (r+1)·Hq/tp)), put back in head order: the tensor that
    ``all_gather`` over the TP group would give. Per-request maxima are then ``.amax(dim)``."""
    out = {}
    for f in ("tv_upper_a", "out_err_upper", "eps_max", "xi", "rho", "flag"):
        parts = [getattr(r, f) for r in per_rank]
        if any(p is None for p in parts):
            continue
        out[f] = torch.cat(parts, dim=dim)
    return out
