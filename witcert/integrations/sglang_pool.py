"""The pool side of WitCert's SGLang patch (issue 36): which pool methods touch KV, and what the
patch does about each, by construction.

Witnesses live in a ``LayerSide`` per *physical buffer* (keyed by the K buffer's ``data_ptr``, the
side holding a reference to the buffer so the address cannot be reused while the side lives):
never by a layer id, which SGLang's hybrid pools number per sub-pool (``layer_id_override``).

Every slot of a side carries an ``unmetered`` bit. A side is born with every slot unmetered
(a slot it has not seen written has no witness); a recorded write clears the bits of the slots it
wrote; anything else that changes a slot sets its bit, and a decode row that reads an unmetered
slot gets TV⁺ = 1, output bound +inf and the flag (``sglang._saturate_rows``), until the slot is
rewritten through a recorded write. So a write path the patch does not understand can only cost
tightness, never soundness. Per pool method of the pinned SGLang (``POOL_API``):

* ``record``: ``MHATokenToKVPool.set_kv_buffer`` (incl. ``layer_id_override`` and
  ``dcp_kv_mask``: only the masked-in rows, the ones SGLang's kernel writes, are recorded);
* ``move``: ``MHATokenToKVPool.move_kv_cache``: the witnesses and bits follow the tokens (gathered
  before, scattered after, as SGLang's move does); the moved bytes are checked against a snapshot
  of the sources and a target that differs is marked unmetered (and any target under a scheme of
  ours, whose codes SGLang does not move);
* ``poison``: ``load_cpu_copy`` (the loaded slots) and ``set_kv_buffer_prefix_valid`` (every
  slot of ``loc_2d``) mark what they write unmetered;
* ``delegates``: the hybrid pools' methods that call the sub-pools' (wrapped) methods;
* ``reads`` / ``meta``: no KV write;
* ``unregistered``: a pool class whose buffers no recorded write registers (other dtypes,
  layouts, MLA, quantized): its decode falls back to SGLang's kernel, unmetered and counted.

``tests/test_sglang_pool.py`` enumerates the pinned SGLang's pool classes and fails when a public
method whose name suggests a KV write is in none of these lists.
"""

from __future__ import annotations

import re

import torch

#: public method names that suggest a KV write / move / copy / free / mask (the enumeration test)
WRITE_NAME = re.compile(r"set|move|cop|free|transfer|load|write|store|clear|mask|reset|swap|evict|put|restore|"
                        r"assign|update|fill|zero|release|resume|donate|alloc|offload|backup|commit|register|"
                        r"finalize|translate|init")

#: wrapped methods of ``MHATokenToKVPool`` (the one class whose buffers a recorded write registers)
WRAPPED = {"set_kv_buffer": "record", "move_kv_cache": "move", "load_cpu_copy": "poison",
           "set_kv_buffer_prefix_valid": "poison"}


def sides_of(pool):
    """(k buffer, side) for each of the pool's K buffers a recorded write registered."""
    from witcert.integrations.sglang import STATE

    out = []
    for kb in getattr(pool, "k_buffer", None) or ():
        if isinstance(kb, torch.Tensor):
            side = STATE.layers.get(kb.data_ptr())
            if side is not None:
                out.append((kb, side))
    return out


def mark_unmetered(side, slots=None):
    """Slots (any int tensor; negative entries ignored) of ``side`` unmetered; all of them when
    ``slots`` is None or cannot be used. Never raises: the last resort is the whole side."""
    try:
        if slots is None:
            side.bad.fill_(True)
            return
        s = torch.as_tensor(slots).reshape(-1).to(side.bad.device).long()
        s = s[(s >= 0) & (s < side.bad.shape[0])]
        side.bad[s] = True
    except Exception:
        side.bad.fill_(True)


def bad_rows(side, kv_indptr, kv_indices, batch):
    """[B, 1] bool: the rows whose CSR slots include an unmetered one (on the device, no sync)."""
    n = kv_indices.numel()
    if n == 0:
        return torch.zeros(batch, 1, dtype=torch.bool, device=kv_indptr.device)
    b = side.bad[kv_indices.long().clamp(0, side.bad.shape[0] - 1)].int()
    c = torch.zeros(n + 1, dtype=torch.int64, device=b.device)
    c[1:] = b.cumsum(0)
    ip = kv_indptr[: batch + 1].long().clamp(0, n)
    return ((c[ip[1:]] - c[ip[:-1]]) > 0)[:, None]


def _count(what):
    from witcert.integrations.sglang import STATE

    STATE.unmetered[what] += 1


def wrap_move_kv_cache(orig):
    """``move_kv_cache(tgt_loc, src_loc)``: witnesses follow the tokens, checked against the bytes."""

    def move_kv_cache(self, tgt_loc, src_loc, *args, **kwargs):
        sides = []
        try:
            tgt, src = tgt_loc.reshape(-1).long(), src_loc.reshape(-1).long()
            for kb, side in sides_of(self):
                sides.append((kb, side, kb[src].clone(), [t[src].clone() for t in _wit(side)], side.bad[src].clone()))
        except Exception as e:
            _count(f"move: {type(e).__name__}: {e}")
            sides = [(kb, side, None, None, None) for kb, side in sides_of(self)]
        out = orig(self, tgt_loc, src_loc, *args, **kwargs)
        for kb, side, snap, wits, bad in sides:
            try:
                if snap is None:
                    raise RuntimeError("no snapshot")
                for t, w in zip(_wit(side), wits):
                    t[tgt] = w
                same = (kb[tgt].reshape(tgt.numel(), -1).view(torch.uint8)
                        == snap.reshape(tgt.numel(), -1).view(torch.uint8)).all(-1)
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
    from witcert.integrations.sglang import STATE

    store = STATE.exact_store
    if store is None or not hasattr(store, "write"):
        return
    try:  # a HostExactStore follows the move; a slot it cannot follow is refused at page-in
        k, v = store(side.layer_id, src)
        store.write(side.layer_id, tgt, k.clone(), v.clone())
    except Exception as e:
        _count(f"exact store move: {type(e).__name__}: {e}")


def wrap_load_cpu_copy(orig):
    """``load_cpu_copy(kv_cache_cpu, indices, ...)``: the loaded slots are unmetered until rewritten."""

    def load_cpu_copy(self, kv_cache_cpu, indices, *args, **kwargs):
        try:
            return orig(self, kv_cache_cpu, indices, *args, **kwargs)
        finally:
            for _, side in sides_of(self):
                mark_unmetered(side, indices)

    load_cpu_copy.__wrapped__ = orig
    load_cpu_copy.__witcert__ = "poison"
    return load_cpu_copy


def wrap_set_kv_buffer_prefix_valid(orig):
    """``set_kv_buffer_prefix_valid(layer, loc_2d, ...)``: every slot of ``loc_2d`` unmetered (all layers)."""

    def set_kv_buffer_prefix_valid(self, layer, loc_2d, *args, **kwargs):
        try:
            return orig(self, layer, loc_2d, *args, **kwargs)
        finally:
            for _, side in sides_of(self):
                mark_unmetered(side, loc_2d)

    set_kv_buffer_prefix_valid.__wrapped__ = orig
    set_kv_buffer_prefix_valid.__witcert__ = "poison"
    return set_kv_buffer_prefix_valid


POOL_WRAPPERS = {"move_kv_cache": wrap_move_kv_cache, "load_cpu_copy": wrap_load_cpu_copy,
                 "set_kv_buffer_prefix_valid": wrap_set_kv_buffer_prefix_valid}
