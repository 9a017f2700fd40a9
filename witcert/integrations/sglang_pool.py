"""The pool side of WitCert's SGLang patch (issue 36): which pool methods touch KV, and what the
patch does about each, by construction.

Witnesses live in a ``LayerSide`` per *physical buffer* (keyed by the K buffer's ``data_ptr``, the
side holding a reference to the buffer so the address cannot be reused while the side lives):
never by a layer id, which SGLang's hybrid pools number per sub-pool (``layer_id_override``).

Every slot of a side carries an ``unmetered`` bit. A side is born with every slot unmetered
(a slot it has not seen written has no witness); a recorded write clears the bits of the slots it
wrote; anything else that changes a slot sets its bit, and a decode row that reads an unmetered
slot gets TV⁺ = 1, output bound +inf and the flag (counted by the decode kernel: ``kernels.unmetered``), until the slot is
rewritten through a recorded write. So a write path the patch does not understand can only cost
tightness, never soundness. Per pool method of the pinned SGLang (``POOL_API``):

* ``record``: ``MHATokenToKVPool.set_kv_buffer`` (incl. ``layer_id_override`` and
  ``dcp_kv_mask``: only the masked-in rows, the ones SGLang's kernel writes, are recorded);
* ``move``: ``MHATokenToKVPool.move_kv_cache``: the witnesses and bits follow the tokens (gathered
  before, scattered after, as SGLang's move does); the moved bytes are checked against a snapshot
  of the sources and a target that differs is marked unmetered (and any target under a scheme of
  ours, whose codes SGLang does not move);
* ``poison``: ``load_cpu_copy`` (the loaded slots), ``set_kv_buffer_prefix_valid`` (every slot of
  ``loc_2d``), ``_finalize_backing_tokens`` (all), the HiCache host pools' device loads (the loaded
  slots) and the allocators' ``alloc*`` (every slot handed out: a writer outside the pools'
  methods, such as a PD-disaggregation transfer, can then never leave a stale witness);
* ``delegates``: the hybrid pools' methods that call the sub-pools' (wrapped) methods;
* ``reads`` / ``meta``: no KV write;
* ``unregistered``: a pool class whose buffers no recorded write registers (other dtypes,
  layouts, MLA, quantized): its decode falls back to SGLang's kernel, unmetered and counted.

``tests/integrations/test_sglang_pool_api.py`` enumerates the pinned SGLang's pool classes and fails when a public
method whose name suggests a KV write is in none of these lists.
"""

from __future__ import annotations

import re

import torch

from witcert.integrations.sglang_state import STATE

#: public method names that suggest a KV write / move / copy / free / mask (the enumeration test)
WRITE_NAME = re.compile(r"set|move|cop|free|transfer|load|write|store|clear|mask|reset|swap|evict|put|restore|"
                        r"assign|update|fill|zero|release|resume|donate|alloc|offload|backup|commit|register|"
                        r"finalize|translate|init")

#: wrapped methods of ``MHATokenToKVPool`` (the one class whose buffers a recorded write registers:
#: ``sglang._recordable`` records only for an instance of exactly the class the wrapper sits on)
WRAPPED = {"set_kv_buffer": "record", "move_kv_cache": "move", "load_cpu_copy": "poison",
           "set_kv_buffer_prefix_valid": "poison", "_finalize_backing_tokens": "poison"}

#: HiCache host pools: their ``load_to_device_per_layer[_physical]`` write the device pool's
#: buffers directly (transfer kernels); every class of these modules that defines one is wrapped:
#: the loaded device slots become unmetered
HOST_MODULES = tuple(f"sglang.srt.mem_cache.pool_host.{m}" for m in
                     ("base", "dsa", "mamba", "mha", "mha_mxfp8", "minimax_m3_nvfp4", "mla", "unified")) + (
                   "sglang.srt.mem_cache.memory_pool_host",)
HOST_LOADS = ("load_to_device_per_layer", "load_to_device_per_layer_physical")

_METERED = "MHATokenToKVPool"
_DELEGATES = "delegates to the sub-pools' methods (wrapped where the sub-pool is an MHATokenToKVPool)"
_READS = "reads KV (no write)"
_META = "bookkeeping (no KV write)"
_HOST = "writes host memory only"
#: every public KV-write-named method of the pinned SGLang's pool classes that the patch does not
#: wrap, with why that is sound ("Class.method"); the enumeration test fails on anything missing
AUDITED = {
    "KVCache.set_kv_buffer": "abstract", "KVCache.load_cpu_copy": "abstract", "KVCache.get_cpu_copy": _READS,
    "KVCache.register_layer_transfer_counter": _META,
    "MHATokenToKVPool.get_cpu_copy": _READS,
    "MHATokenToKVPool.finalize_backing": "calls _finalize_backing_tokens (wrapped: every slot unmetered)",
    "BaseSWAKVPool.register_mapping": _META, "BaseSWAKVPool.translate_loc_from_full_to_swa": _META,
    "SWAKVPool.set_kv_buffer": _DELEGATES, "SWAKVPool.set_mla_kv_buffer": _DELEGATES,
    "SWAKVPool.move_kv_cache": _DELEGATES, "SWAKVPool.load_cpu_copy": _DELEGATES,
    "SWAKVPool.finalize_backing": "calls the sub-pools' _finalize_backing_tokens (wrapped)",
    "SWAKVPool.set_index_k_scale_buffer": _DELEGATES + " (an index-K buffer: DSA full pools only)",
    "SWAKVPool.get_cpu_copy": _READS, "SWAKVPool.register_mapping": _META,
    "SWAKVPool.register_layer_transfer_counter": _META, "SWAKVPool.translate_loc_from_full_to_swa": _META,
}
for _c in ("HostKVCache", "DSAIndexerPoolHost", "MambaPoolHost", "MHATokenToKVPoolHost", "MHATokenToKOnlyPoolHost",
           "HiSparseMHATokenToKVPoolHost", "AsymmetricMHATokenToKVPoolHost", "MHATokenToKVPoolMXFP8Host",
           "MiniMaxM3Nvfp4IndexKPoolHost", "MLATokenToKVPoolHost", "UnifiedPageEnvelopeHostPool", "LogicalHostPool",
           "DeepSeekV4PagedHostPool", "DeepSeekV4StateHostPool"):
    for _m in ("init_kv_buffer", "set_from_flat_data_page", "clear", "alloc", "free", "prepare_transfer_indices"):
        AUDITED[f"{_c}.{_m}"] = _HOST
    for _m in ("backup_from_device_all_layer", "backup_from_device_all_layer_physical",
               "backup_tokens_from_device_all_layer"):
        AUDITED[f"{_c}.{_m}"] = "reads the device pool into host memory"
AUDITED["MiniMaxM3Nvfp4IndexKPoolHost.prepare_layer_loader"] = (
    "a loader for MiniMax M3 NVFP4 device pools (never registered: their decode is unmetered)")

#: attention KV pool classes whose buffers no recorded write registers (an instance of another
#: class than MHATokenToKVPool: ``sglang._recordable``); a decode over them goes to SGLang's kernel,
#: unmetered and counted, so none of their methods can make a bound unsound
UNREGISTERED = ("NoOpMHATokenToKVPool", "MHATokenToKVPoolFP4", "PageMajorMHATokenToKVPool", "MHATokenToKVPoolMXFP8",
                "HybridLinearKVPool", "MLATokenToKVPool", "MLATokenToKVPoolFP4", "DSATokenToKVPool",
                "MHATokenToKOnlyPool", "MiniMaxSparseKVPool", "HiSparseDSATokenToKVPool", "HiSparseMHAMainPool",
                "PageInterleaveMHATokenToKVPool", "PageInterleaveMLATokenToKVPool", "PageInterleaveDSATokenToKVPool",
                "UnifiedMHATokenToKVPool", "UnifiedMLATokenToKVPool", "UnifiedHybridLinearKVPool",
                "UnifiedSWAKVPool", "QSATokenToKVPool", "DeepSeekV4SingleKVPool", "DeepSeekV4UniformFP8KVPool",
                "HiSparseC4DevicePool", "DeepSeekV4IndexerPool", "DeepSeekV4TokenToKVPool",
                "MiniMaxM3Nvfp4IndexKPool", "MiniMaxM3Nvfp4MainKVPool", "MiniMaxM3Nvfp4KVPool",
                "LayerSplitDSATokenToKVPool")
#: allocators: every slot they hand out is unmetered until a recorded write (so a slot recorded,
#: freed and filled again by a writer outside the pools' methods, e.g. a PD-disaggregation transfer
#: through raw pointers, never keeps its old witness); the wrapped ``alloc*`` methods, per class
ALLOC_WRAPPED = {"sglang.srt.mem_cache.allocator.token": {"TokenToKVPoolAllocator": ("alloc",)},
                 "sglang.srt.mem_cache.allocator.paged": {
                     "PagedTokenToKVPoolAllocator": ("alloc", "alloc_extend", "alloc_decode")}}
#: allocator classes not wrapped, and why
ALLOC_AUDITED = {
    "BaseTokenToKVPoolAllocator": "abstract (alloc_extend / alloc_decode raise)",
    "SWATokenToKVPoolAllocator": "allocates through its full / SWA sub-allocators (Token/Paged: wrapped)",
    "PureSWATokenToKVPoolAllocator": "allocates through its SWA sub-allocator (TokenToKVPoolAllocator: wrapped)",
    "MambaSlotAllocator": "mamba state slots, not attention KV",
    "HiSparseTokenToKVPoolAllocator": "HiSparse pools (never registered)",
    "DeepSeekV4HiSparseTokenToKVPoolAllocator": "DeepSeek V4 pools (never registered)",
    "PageInterleavePoolAllocator": "page-interleave pools (never registered)",
    "UnifiedSWAAllocatorBase": "unified pools (never registered)",
    "UnifiedSWATokenToKVPoolAllocator": "unified pools (never registered)",
    "UnifiedMambaSWATokenToKVPoolAllocator": "unified pools (never registered)",
    "UnifiedMambaTokenToKVPoolAllocator": "unified pools (never registered)",
    "MultiEndedAllocator": "unified pools (never registered)",
    "FloatMultiEndedAllocator": "unified pools (never registered)",
}

#: the device-pool modules the enumeration test walks
POOL_MODULES = tuple(f"sglang.srt.mem_cache.{m}" for m in
                     ("memory_pool", "swa_memory_pool", "base_swa_memory_pool", "hisparse_memory_pool",
                      "page_interleave_pool", "unified_memory_pool", "qsa_kv_pool", "deepseek_v4_memory_pool",
                      "minimax_m3_nvfp4_pool", "dsa_cache_layer_split"))


def sides_of(pool):
    """(k buffer, side) for each of the pool's K buffers a recorded write registered."""
    out = []
    bufs = getattr(pool, "k_buffer", None)
    for kb in bufs if isinstance(bufs, (list, tuple)) else ():
        if isinstance(kb, torch.Tensor):
            side = STATE.layers.get(kb.data_ptr())
            if side is not None:
                out.append((kb, side))
    return out


def mark_device_slots(pool, slots):
    """A write into ``pool`` at ``slots`` that was not recorded: those slots unmetered on the
    pool's own sides; a composite pool's sub-pools (another index space) wholly unmetered."""
    for _, side in sides_of(pool):
        mark_unmetered(side, slots)
    mapping = getattr(pool, "full_to_swa_index_mapping", None)
    for attr in ("full_kv_pool", "swa_kv_pool"):
        sub = getattr(pool, attr, None)
        if sub is not None:
            sub_slots = slots
            if attr == "swa_kv_pool":
                try:
                    sub_slots = None if slots is None or mapping is None else mapping[torch.as_tensor(slots).long()]
                except Exception:
                    sub_slots = None
            for _, side in sides_of(sub):
                mark_unmetered(side, sub_slots)


def slot_indices(slots: torch.Tensor, size: int) -> torch.Tensor:
    """``slots`` (int32 / int64 slot indices of a pool of ``size`` rows) as int64, a negative one counted from the
    end as torch indexing (and so SGLang's write) reads it: -1 is row ``size`` − 1, not a side's trash row past the
    pool. A mask or any other dtype is refused (ValueError): read as slot numbers 0 / 1 it would leave the slots
    it selects metered with stale witnesses (review, 2026-12-05). No host synchronisation."""
    if slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot indices: expected an int32 / int64 tensor, got {slots.dtype}")
    s = slots.long()
    return torch.where(s < 0, s + size, s)


def mark_unmetered(side, slots=None):
    """Slots (an int tensor or a sequence of ints; negative ones counted from the end, as torch indexing reads
    them) of ``side`` unmetered; all of them when ``slots`` is None or cannot be used (a mask, another dtype).
    Never raises: the last resort is the whole side."""
    try:
        if slots is None:
            side.bad.fill_(True)
            return
        s = slots if isinstance(slots, torch.Tensor) else torch.as_tensor(slots, dtype=torch.int64)
        s = slot_indices(s.reshape(-1).to(side.bad.device), side.trash)
        # no boolean-mask indexing (a host sync) and no scalar index_put (a host copy): a CUDA graph captures this;
        # slots still out of range go to the trash row past the pool (``LayerSide.rows``: ``bad`` is a view without it)
        s = torch.where((s >= 0) & (s < side.bad.shape[0]), s, side.trash)
        side.rows[4].index_fill_(0, s, True)
    except Exception:
        side.bad.fill_(True)


def bad_rows(side, kv_indptr, kv_indices, batch):
    """[B, 1] bool: the rows whose CSR slots include an unmetered one, or one outside the pool (no witness: the
    kernel read bytes that are no token's; SGLang never sends one), on the device, no sync."""
    n = kv_indices.numel()
    if n == 0:
        return torch.zeros(batch, 1, dtype=torch.bool, device=kv_indptr.device)
    idx, size = kv_indices.long(), side.bad.shape[0]
    b = (side.bad[idx.clamp(0, size - 1)] | (idx < 0) | (idx >= size)).int()
    c = torch.zeros(n + 1, dtype=torch.int64, device=b.device)
    c[1:] = b.cumsum(0)
    ip = kv_indptr[: batch + 1].long().clamp(0, n)
    return ((c[ip[1:]] - c[ip[:-1]]) > 0)[:, None]


def _count(what):
    STATE.unmetered[what] += 1


def wrap_move_kv_cache(orig):
    """``move_kv_cache(tgt_loc, src_loc)``: witnesses follow the tokens, checked against the bytes."""

    def move_kv_cache(self, tgt_loc, src_loc, *args, **kwargs):
        sides = []
        try:
            tgt, src = tgt_loc.reshape(-1).long(), src_loc.reshape(-1).long()
            vbs = {kb.data_ptr(): vb for kb, vb in zip(self.k_buffer, self.v_buffer)}
            for kb, side in sides_of(self):
                vb = vbs[kb.data_ptr()]
                sides.append(((kb, vb), side, (kb[src].clone(), vb[src].clone()), [t[src].clone() for t in _wit(side)],
                              side.bad[src].clone()))
        except Exception as e:
            _count(f"move: {type(e).__name__}: {e}")
            sides = [(kb, side, None, None, None) for kb, side in sides_of(self)]
        try:
            out = orig(self, tgt_loc, src_loc, *args, **kwargs)
        except BaseException:  # a move that failed part-way: its targets have no witness
            for _, side in sides_of(self):
                mark_unmetered(side, tgt_loc)
            raise
        for kb, side, snap, wits, bad in sides:
            try:
                if snap is None:
                    raise RuntimeError("no snapshot")
                for t, w in zip(_wit(side), wits):
                    t[tgt] = w
                same = torch.ones(tgt.numel(), dtype=torch.bool, device=side.bad.device)
                for buf, sn in zip(kb, snap):  # K and V: the bytes at the targets are the sources'
                    same &= (buf[tgt].reshape(tgt.numel(), -1).view(torch.uint8)
                             == sn.reshape(tgt.numel(), -1).view(torch.uint8)).all(-1).to(same.device)
                side.bad[tgt] = bad | ~same | (side.ours is not None)
                _move_store(side, tgt, src)
            except Exception as e:  # the targets lose their witnesses
                _count(f"move: {type(e).__name__}: {e}")
                mark_unmetered(side, tgt_loc if snap is not None else None)
        return out

    move_kv_cache.__wrapped__ = orig
    move_kv_cache.__witcert__ = "move"
    return move_kv_cache


def _wit(side):
    return (side.k_wit, side.v_wit, side.v_norm, side.k_norm)


def _move_store(side, tgt, src):
    store = STATE.exact_store
    if store is None or not hasattr(store, "write"):
        return
    try:  # a HostExactStore follows the move; a slot it cannot follow is refused at page-in
        k, v = store(side.layer_id, src)
        store.write(side.layer_id, tgt, k.clone(), v.clone())
    except Exception as e:
        _count(f"exact store move: {type(e).__name__}: {e}")


def _unmetering(name: str, slots: tuple[int, str] | None):
    """A wrapper factory for a pool method that changes KV without a recorded write: after the call (also
    when it raises) the slots it names are unmetered until rewritten — the argument at positional index /
    keyword ``slots`` (after ``self``), or every slot (``slots`` None)."""

    def wrap(orig):
        def wrapper(self, *args, **kwargs):
            try:
                return orig(self, *args, **kwargs)
            finally:
                idx = None if slots is None else kwargs.get(slots[1], args[slots[0]] if len(args) > slots[0] else None)
                for _, side in sides_of(self):
                    mark_unmetered(side, idx)  # (None: every slot, the conservative reading)

        wrapper.__name__ = wrapper.__qualname__ = name
        wrapper.__doc__ = orig.__doc__
        wrapper.__wrapped__ = orig
        wrapper.__witcert__ = "poison"
        return wrapper

    return wrap


#: ``load_cpu_copy(kv_cache_cpu, indices, ...)``: the loaded slots are unmetered until rewritten
wrap_load_cpu_copy = _unmetering("load_cpu_copy", (1, "indices"))
#: ``set_kv_buffer_prefix_valid(layer, loc_2d, ...)``: every slot of ``loc_2d`` unmetered (all layers)
wrap_set_kv_buffer_prefix_valid = _unmetering("set_kv_buffer_prefix_valid", (1, "loc_2d"))
#: ``_finalize_backing_tokens``: the backing (and maybe the buffers) change: every slot unmetered
wrap_finalize_backing_tokens = _unmetering("_finalize_backing_tokens", None)


def wrap_host_load(orig):
    """A host pool's ``load_to_device_per_layer[_physical](device_pool, host_indices, device_indices, …)``:
    the device slots it loads are unmetered until rewritten."""
    sig = None
    try:
        import inspect

        sig = inspect.signature(orig)
    except (TypeError, ValueError):
        pass

    def load(self, *args, **kwargs):
        try:
            return orig(self, *args, **kwargs)
        finally:
            try:
                b = sig.bind(self, *args, **kwargs).arguments
                mark_device_slots(b["device_pool"], b["device_indices"])
            except Exception:  # cannot tell what was loaded where: every side of the device pool
                dev = kwargs.get("device_pool", args[0] if args else None)
                mark_device_slots(dev, None)

    load.__wrapped__ = orig
    load.__witcert__ = "poison"
    load.__name__ = getattr(orig, "__name__", "load")
    return load


def wrap_alloc(orig):
    """An allocator's ``alloc*``: the token slots it returns are unmetered until a recorded write."""

    def alloc(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        if isinstance(out, torch.Tensor) and not out.is_floating_point() and out.dtype != torch.bool:
            pool = getattr(self, "_kvcache", None)
            if pool is not None and _has_sides():
                mark_device_slots(pool, out)
        return out

    alloc.__wrapped__ = orig
    alloc.__witcert__ = "poison"
    alloc.__name__ = getattr(orig, "__name__", "alloc")
    return alloc


def _has_sides():  # no per-step work before the first recorded write
    return bool(STATE.layers)


POOL_WRAPPERS = {"_finalize_backing_tokens": wrap_finalize_backing_tokens, "move_kv_cache": wrap_move_kv_cache,
                 "load_cpu_copy": wrap_load_cpu_copy, "set_kv_buffer_prefix_valid": wrap_set_kv_buffer_prefix_valid}
