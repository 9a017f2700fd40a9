"""One layer's storage of ``WitCertCache`` (``witcert.cache``): ``WitCertLayer`` (transformers' layer API,
the writes of both paths: the reference path's served store and witnesses, the kernel path's paged
writes through ``kernels.write``, and ``page_in``) and ``_ExactLayer`` (a layer outside
``compress_layers``). Re-exported by ``witcert.cache``.

Storage per layer (B sequences, Hkv kv heads, n tokens, head dim D, G groups):

    exact_k, exact_v  [B, Hkv, n, D]  model dtype: the exact backing store (pinned host memory
                                      when the model is on CUDA); written once per token, never
                                      by serving or repair
    k_hat, v_hat      [B, Hkv, n, D]  float32 on the model's device: what attention reads
    k_wit             [B, Hkv, n, G]  float64 ≥ ‖(k̂_j − k_j)[g]‖ (per token; ``witness="block"``
                                      meters with the maximum over each block of T tokens)
    v_wit             [B, Hkv, n]     float64 ≥ ‖v̂_j − v_j‖
    k_scale           [B, Hkv, n]     int8_dither key scales (Tier B)
    repaired          [B, Hkv, nblk]  bool: block paged in (exact, witnesses 0)

Schemes whose key statistics span a block of tokens (``kivi2``) quantize a block when it is
full; until then its tokens stay exact (KIVI's full-precision residual), with witness 0.
"""

from __future__ import annotations

import logging
import threading
import weakref

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from contract.schemes import BLOCK_SCHEMES, SCHEMES

from . import bounds as B
from . import schemes as S
from .graph_pool import POOL, storage_key
from .schemes import QuantContext, quantize
from .store import append_pair

log = logging.getLogger("witcert.cache")



#: the cache whose layer wrote last on this thread, for the attention function (a weak reference: a
#: strong one kept a finished request's cache — its pinned exact store, ~64 GB by arithmetic at Llama-8B /
#: B 8 / 32K — alive until the next request wrote, and the device machine ran out of host memory, run I5)
_ACTIVE = threading.local()


class WitCertLayer(CacheLayerMixin):
    """One layer's storage (see the module docstring). Created by ``WitCertCache``."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, owner, layer_idx: int):  # owner: the WitCertCache (witcert.cache)
        super().__init__()
        # a weak reference: a layer never keeps its cache alive, so a dropped cache is freed at once (its
        # exact stores' host-pool leases go back) instead of waiting for the cycle collector, whose pass
        # the next request's lease would otherwise pay on its path (~0.26 s at B 1 / 4K, bench/SERVING.md)
        self._owner = weakref.ref(owner)
        self.layer_idx = layer_idx
        self._pending = None

    @property
    def owner(self):
        """The WitCertCache this layer belongs to."""
        o = self._owner()
        if o is None:
            raise RuntimeError("WitCertCache layer used after its cache was freed")
        return o

    # -- transformers' layer API
    def lazy_initialization(self, key_states, value_states) -> None:
        o = self.owner
        self.dtype, self.device = key_states.dtype, key_states.device
        Bsz, H, _, D = key_states.shape
        if H != o.num_kv_heads or D != o.head_dim:
            raise ValueError(f"layer {self.layer_idx}: keys [B, {H}, n, {D}] do not match the cache's model "
                             f"({o.num_kv_heads} kv heads, head dim {D}); a WitCertCache belongs to one model")
        # scheme "none" with the meter off stores nothing compressed: the exact store is what
        # attention reads, so it stays on the model's device (as in transformers' DynamicLayer)
        passthrough = o.scheme == "none" and not o.meter
        z = lambda *s, dt, dev: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        if passthrough:
            self._ek = z(Bsz, H, 0, D, dt=self.dtype, dev=self.device)
            self._ev = z(Bsz, H, 0, D, dt=self.dtype, dev=self.device)
        else:  # the backing store: host memory (pinned on CUDA: the process's HostPool), async appends
            self._ek, self._ev = o._open_stores(key_states, pin=self.device.type == "cuda")
        # what attention reads: float32 holds every bf16 / fp16 / fp32 value exactly; a float64
        # model keeps float64 (an unmetered cast to float32 would be a silent error)
        self.served_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.k_hat = z(Bsz, H, 0, D, dt=self.served_dtype, dev=self.device)
        self.v_hat = z(Bsz, H, 0, D, dt=self.served_dtype, dev=self.device)
        self.k_wit = z(Bsz, H, 0, o.num_groups, dt=torch.float64, dev=self.device)
        self.v_wit = z(Bsz, H, 0, dt=torch.float64, dev=self.device)
        self.k_scale = z(Bsz, H, 0, dt=torch.float32, dev=self.device)
        # the residual sketch r̃ of each served token (0 where served exact), reference path only
        self.k_sk = z(Bsz, H, 0, D, dt=torch.float64, dev=self.device) if o.sketch_bits else None
        self.repaired = torch.zeros(Bsz, H, 0, dtype=torch.bool, device=self.device)
        self.n_quantized = 0
        self.paged = None
        self.rep = None  # kernel path, gated: the repaired pages (kernels.repair.RepairOverlay)
        self.win = None  # kernel path: the exact window's rings (kernels.exact_window.ExactWindow)
        self.decode_checked = None  # kernel path: the launch last checked by witcert.selftest_decode (its memo)
        if o.use_kernel(self.device, Bsz, self.dtype):
            per_seq = -(-o.max_tokens // o.block_size)
            kept = self._pooled_storage(Bsz, per_seq) if o.cuda_graph else None
            if kept is not None:  # an earlier request's tensors (witcert.graph_pool: never read before written)
                self.paged, self.block_table, self.win = kept
                self._check_adopted()
                # but a page's ν / κ running max (block_norms) is merged into, not overwritten: start it at 0
                self.paged.v_norm.zero_()
                self.paged.k_norm.zero_()
            else:
                self._allocate_kernel_storage(Bsz, per_seq, H, D)
        self.is_initialized = True

    def _pooled_storage(self, Bsz: int, per_seq: int):
        """This layer's tensors from the cache's pooled storage (taken at the request's first layer), or None
        (a new storage: this layer allocates and records its tensors there)."""
        holder = self.owner._storage
        if holder.storage is None:
            holder.storage = POOL.take(storage_key(self.owner, Bsz, per_seq, self.dtype, self.device))
        return holder.storage.layers[self.layer_idx]

    def _check_adopted(self) -> None:
        """RuntimeError unless an adopted storage has the kernel variant this cache asked for (the pool's key holds
        every setting the storage fixes; this catches one it misses instead of serving another form silently)."""
        o, p = self.owner, self.paged
        keyed = SCHEMES[o.scheme].position_keyed  # (the dither seed: a launch argument the capture replays)
        have = (p.scheme, p.block_size, p.sketch_bits, bool(p.head_levels), bool(p.has_weights),
                p.seed if keyed else None, None if self.win is None else (self.win.sink, self.win.recent))
        w = o.weights  # (PagedKV.has_weights: a weight not 1 in this layer)
        want = (o.scheme, o.block_size, o.sketch_bits, bool(o.kernel_head_levels),
                w is not None and bool((w[self.layer_idx] != 1).any()),
                o.seed if keyed else None, tuple(o.window) if sum(o.window) else None)
        if have != want:
            raise RuntimeError(f"witcert.graph_pool: a pooled storage of {have} handed to a cache of {want}")

    def _allocate_kernel_storage(self, Bsz: int, per_seq: int, H: int, D: int) -> None:
        """The kernel path's paged K / V, block table, overlay and window rings of this layer (recorded in the
        cache's pooled storage when it has one)."""
        from kernels.paged import PagedKV
        from kernels.repair import RepairOverlay

        from .selftest import check_window_kernel, check_write_kernel

        o = self.owner
        self.paged = PagedKV.allocate(Bsz * per_seq, H, D, scheme=o.scheme, block_size=o.block_size, num_groups=1,
                                      per_token_witness=True, model_dtype=self.dtype, device=self.device,
                                      seed=o.seed, layer=self.layer_idx, with_exact=False, sketch_bits=o.sketch_bits,
                                      weights=None if o.weights is None else torch.from_numpy(o.weights[self.layer_idx]),
                                      head_levels=o.kernel_head_levels, block_norms=True)
        # the compiled write on this device, once per configuration and process (witcert.selftest: a canary's
        # stored witnesses against its stored codes; raises rather than meter with unsound witnesses)
        check_write_kernel(self.paged, self.dtype)
        self.block_table = torch.arange(Bsz * per_seq, dtype=torch.int32, device=self.device).view(Bsz, per_seq)
        # the overlay: the gate's repaired pages, and a block scheme's partial last page (held exact)
        if o.gate is not None or o.scheme in BLOCK_SCHEMES:
            self.rep = RepairOverlay.allocate(Bsz * per_seq, H, o.block_size, D, self.dtype,
                                              device=self.device).bind(self.paged)
        if sum(o.window):  # the exact window's rings (kernels.exact_window.ExactWindow)
            from kernels.exact_window import ExactWindow

            self.win = ExactWindow.allocate(Bsz, H, D, self.dtype, *o.window, device=self.device)
            check_window_kernel(self.win, self.dtype)
        held = o._storage.storage
        if o.cuda_graph and held is not None and held.layers[self.layer_idx] is None:
            held.layers[self.layer_idx] = (self.paged, self.block_table, self.win)

    @property
    def exact_k(self) -> torch.Tensor:
        """The exact keys written so far [B, Hkv, n, D], after every pending asynchronous append has
        landed (``ExactStore.wait``: a host sync on CUDA when one is pending; a copy when the store
        spans chunks). Not for the hot path (``_exact(lo, hi)`` reads a window)."""
        return self._ek.ready() if isinstance(self._ek, self.owner._store_type) else self._ek

    @property
    def exact_v(self) -> torch.Tensor:
        return self._ev.ready() if isinstance(self._ev, self.owner._store_type) else self._ev

    # transformers' layer attributes ``keys`` / ``values``: the exact K / V [B, Hkv, n, D], read on
    # demand (a chunked store's tokens are gathered then; nothing is built per layer step). The base
    # class assigns them (None at init / reset): ignored, the store is the truth.
    @property
    def keys(self):
        return self.exact_k if getattr(self, "is_initialized", False) else None

    @keys.setter
    def keys(self, value) -> None:
        pass

    @property
    def values(self):
        return self.exact_v if getattr(self, "is_initialized", False) else None

    @values.setter
    def values(self, value) -> None:
        pass

    def _exact(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact (K, V) of tokens lo..hi [B, Hkv, hi − lo, D], after pending appends have landed."""
        if isinstance(self._ek, self.owner._store_type):
            return self._ek.read(lo, hi), self._ev.read(lo, hi)
        return self._ek[..., lo:hi, :], self._ev[..., lo:hi, :]

    def _batch(self) -> int:
        return self._ek.shape[0]

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return len(self._ek) if isinstance(self._ek, self.owner._store_type) else self._ek.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        for st in (getattr(self, "_ek", None), getattr(self, "_ev", None)):
            if isinstance(st, self.owner._store_type):
                st.release()  # its memory back to the host pool (kept pinned) for the next request
        self.is_initialized = False
        self.keys = self.values = None
        self._pending = None

    def reorder_cache(self, beam_idx) -> None:
        """Beam search: sequence b continues from sequence ``beam_idx[b]``. Every per-sequence
        store is copied (exact, served, witnesses, repairs; the kernel path's blocks), so the
        meter keeps reading each beam's own tokens."""
        if not self.is_initialized:
            return
        idx = beam_idx.to(self.device).long()
        if isinstance(self._ek, self.owner._store_type):
            self._ek.reorder(idx)
            self._ev.reorder(idx)
        else:
            self._ek, self._ev = self._ek.index_select(0, idx), self._ev.index_select(0, idx)
        for name in ("k_hat", "v_hat", "k_wit", "v_wit", "k_scale", "repaired"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        if self.k_sk is not None:
            self.k_sk = self.k_sk.index_select(0, idx)
        if self.paged is not None:
            Bsz, per_seq = self.block_table.shape
            self.paged = self.paged.reordered(Bsz, per_seq, idx)
            if self.rep is not None:
                self.rep = self.rep.reordered(Bsz, per_seq, idx).bind(self.paged)
            if self.win is not None:
                self.win = self.win.select(idx)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` tokens (transformers' convention: a negative
        count; assisted / speculative decoding rolls back rejected tokens). The served store,
        witnesses and the exact store shrink together; a block scheme's partial block returns
        to exact (KIVI's residual), so what stays is metered as before."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop: pass a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        n = self.get_seq_length()
        n1 = max(0, n + int(tokens_to_remove))
        if isinstance(self._ek, self.owner._store_type):
            self._ek.crop(n1)
            self._ev.crop(n1)
        else:
            self._ek, self._ev = self._ek[..., :n1, :], self._ev[..., :n1, :]
        o = self.owner
        T = o.block_size
        if self.paged is not None and o.scheme in BLOCK_SCHEMES:
            # kernel path: held pages past the new end are given back
            per_seq = self.block_table.shape[1]
            self.rep.release_held(sorted({b for (b, _) in self.rep.held if b % per_seq >= -(-n1 // T)}))
        if self.paged is not None and o.scheme in BLOCK_SCHEMES and n1 % T:
            # the new partial last page is served exact again (held; its tokens from the exact store),
            # unless it is held or repaired already
            p = n1 // T
            lo = p * T
            ek, ev = self._exact(lo, n1)
            self.rep.hold(self._page_blocks(p), ek.to(self.device), ev.to(self.device))
        if self.paged is not None and self.paged.block_norms:
            self._recompute_page_norms(n1)
        if self.win is not None and n1 > 0:  # the recent window moved back onto tokens the ring no longer holds
            lo = max(0, n1 - self.win.recent)
            ek, ev = self._exact(lo, n1)
            Bsz, H = ek.shape[:2]
            m = n1 - lo
            self.win.write(torch.arange(Bsz, device=self.device).repeat_interleave(m),
                           torch.arange(lo, n1, device=self.device).repeat(Bsz),
                           ek.to(self.device).transpose(1, 2).reshape(Bsz * m, H, -1),
                           ev.to(self.device).transpose(1, 2).reshape(Bsz * m, H, -1), n1)
        if self.k_hat.shape[-2] > n1:
            self.k_hat, self.v_hat = self.k_hat[..., :n1, :], self.v_hat[..., :n1, :]
            self.k_wit, self.v_wit, self.k_scale = self.k_wit[..., :n1, :], self.v_wit[..., :n1], self.k_scale[..., :n1]
            if self.k_sk is not None:
                self.k_sk = self.k_sk[..., :n1, :]
            self.repaired = self.repaired[..., : -(-n1 // T)]
            # tokens back inside the window (or a partial block) are served exact again
            lo, end = o.quantized_range(n1)
            keep = min(max(end, 0), self.n_quantized)
            a, b = max(keep, lo), min(self.n_quantized, n1)
            if a < b:
                ek, ev = self._exact(a, b)
                self.k_hat[..., a:b, :] = ek.to(self.device, self.served_dtype)
                self.v_hat[..., a:b, :] = ev.to(self.device, self.served_dtype)
                self.k_wit[..., a:b, :] = 0
                self.v_wit[..., a:b] = 0
                self.k_scale[..., a:b] = 0
                if self.k_sk is not None:
                    self.k_sk[..., a:b, :] = 0
            self.n_quantized = keep

    def _recompute_page_norms(self, n1: int) -> None:
        """After a crop to ``n1`` tokens: the pages' ν / κ running maxima (``PagedKV.block_norms``) from the new last
        page on start again at 0, so a removed token's norm (an inf, a large outlier) does not stay in its page's
        maximum; the new partial last page's kept tokens are written again from the exact store (the same codes:
        the write is deterministic in the token and its position), which merges their norms back. A block scheme's
        partial last page is held exact (its norms are the overlay's) until it is quantized whole."""
        from kernels.write import write_kv

        T, (Bsz, per_seq) = self.owner.block_size, self.block_table.shape
        p0 = n1 // T
        H = self.paged.num_kv_heads
        for t in (self.paged.v_norm, self.paged.k_norm):
            t.view(Bsz, per_seq, H, 1)[:, p0:] = 0
        lo = p0 * T
        if n1 > lo and self.owner.scheme not in BLOCK_SCHEMES:
            ek, ev = self._exact(lo, n1)
            m = n1 - lo
            seq, pos, slots = self._step_slots(Bsz, m, lo, n1)
            kf, vf = (x.to(self.device, self.dtype).transpose(1, 2).reshape(Bsz * m, H, -1) for x in (ek, ev))
            write_kv(self.paged, kf, vf, self.block_table, seq, pos, store_exact=False, validate=False, slots=slots)

    # -- writes
    def update(self, key_states, value_states, *args, **kwargs):
        o = self.owner
        if o._static is not None:  # a decode step of the graphed runner (witcert.graphs)
            return self._update_static(o._static, key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != self._batch() or key_states.dtype != self.dtype:
            raise ValueError("WitCertCache: batch size / dtype changed inside a request; call cache.reset() between requests")
        first = self.get_seq_length() == 0
        passthrough = o.scheme == "none" and not o.meter
        if passthrough:  # as transformers' DynamicLayer: concatenated on the model's device
            self._ek = torch.cat([self._ek, key_states.detach()], dim=-2)
            self._ev = torch.cat([self._ev, value_states.detach()], dim=-2)
        else:  # O(new tokens), asynchronous on CUDA (one event after both copies)
            append_pair(self._ek, self._ev, key_states, value_states)
        if self.paged is not None:
            self._write_kernel(key_states.detach(), value_states.detach())
        elif not passthrough:
            self._append_served(key_states.detach(), value_states.detach())
        self._pending = "base" if (passthrough or first) else "served"
        _ACTIVE.cache = o._weak
        if passthrough:
            return self._ek, self._ev
        return key_states, value_states  # not read by the "witcert" attention on the served path

    def _update_static(self, st, key_states, value_states):
        """One decode token of every sequence, written through the runner's static buffers
        (``witcert.graphs.StaticStep``: positions, slots and the staging of the exact store live in
        device tensors, so the step can be captured in a CUDA graph and replayed). The host-side
        bookkeeping (the exact store's append from the staging buffer, step counters, records) is the
        runner's, once per step."""
        Bsz, H, m, D = key_states.shape
        k, v = key_states.detach(), value_states.detach()
        st.stage[self.layer_idx, 0].copy_(k[:, :, 0])
        st.stage[self.layer_idx, 1].copy_(v[:, :, 0])
        from kernels.write import write_kv

        write_kv(self.paged, k[:, :, 0].contiguous(), v[:, :, 0].contiguous(), self.block_table, st.seq, st.pos,
                 store_exact=False, validate=False, slots=st.slots)
        if self.win is not None:  # one launch (kernels.exact_window): captured with the step
            self.win.write(st.seq, st.pos, k[:, :, 0], v[:, :, 0], st.lens)  # (lens = pos + 1: no launch for it)
        self._pending = "served"
        _ACTIVE.cache = self.owner._weak
        return key_states, value_states

    def ensure_capacity(self, n1: int) -> bool:
        """Kernel path: grow the paged cache (and overlay) to hold ``n1`` tokens per sequence,
        geometrically (amortised O(1) per token, never an error). Returns whether it grew (new
        tensors: a captured decode step reading the old ones is stale)."""
        o = self.owner
        Bsz, per_seq = self.block_table.shape
        if n1 <= per_seq * o.block_size:
            return False
        new_pages = per_seq
        while new_pages * o.block_size < n1:
            new_pages *= 2
        log.info("WitCertCache layer %d: kernel cache grows from %d to %d pages per sequence",
                 self.layer_idx, per_seq, new_pages)
        self.paged = self.paged.regrouped(Bsz, per_seq, new_pages)
        if self.rep is not None:
            self.rep = self.rep.regrouped(Bsz, per_seq, new_pages).bind(self.paged)
        self.block_table = torch.arange(Bsz * new_pages, dtype=torch.int32, device=self.device).view(Bsz, new_pages)
        return True

    def _write_kernel(self, k, v):
        """Kernel path: quantize + witnesses in one pass (kernels.write) into the paged layout."""
        from kernels.write import write_kv

        o = self.owner
        Bsz, H, m, D = k.shape
        n1 = self.get_seq_length()
        n0 = n1 - m
        self.ensure_capacity(n1)
        seq, p, slots = self._step_slots(Bsz, m, n0, n1)
        kf, vf = k.transpose(1, 2).reshape(Bsz * m, H, D), v.transpose(1, 2).reshape(Bsz * m, H, D)
        if self.win is not None:  # the exact window's rings: the sinks and the last `recent` tokens
            self.win.write(seq, p, kf, vf, n1)
        if o.scheme in BLOCK_SCHEMES:
            self._write_blocks(k, v, n0, n1, kf, vf, slots)
            return
        write_kv(self.paged, kf, vf, self.block_table, seq, p, store_exact=False, validate=False, slots=slots)
        if self.rep is not None:  # repair is persistent: a token written into a repaired page is served exact
            T = o.block_size
            self.rep.write(slots // T, slots % T, kf, vf)

    def _step_slots(self, Bsz: int, m: int, n0: int, n1: int):
        """(sequence ids [N], logical positions [N] int32, physical slots [N] int64) of this
        step's new tokens (N = B·m, sequence-major), as ``kernels.write.token_slots`` gives them.
        Every layer's block table is the identity layout ``arange(B·pages).view(B, pages)``
        (``lazy_initialization``, growth; ``reorder_cache`` moves blocks, not table entries), so
        the three are a function of (B, m, n0, n1, pages) alone: computed at the step's first
        layer, reused by the others (five small tensor ops per layer step fewer, and the slots are not
        gathered again for the overlay)."""
        from kernels.write import token_slots

        key = (Bsz, m, n0, n1, self.block_table.shape[1], self.device)
        memo = self.owner._slots_memo
        if memo is None or memo[0] != key:
            p = torch.arange(n0, n1, device=self.device, dtype=torch.int32).repeat(Bsz)
            seq = torch.arange(Bsz, device=self.device).repeat_interleave(m)
            memo = (key, seq, p, token_slots(self.paged, self.block_table, seq, p, validate=False).contiguous())
            self.owner._slots_memo = memo
        return memo[1], memo[2], memo[3]

    def _page_blocks(self, page: int) -> list:
        """The physical block of logical page ``page`` of every sequence (the layer's table is
        sequence b owning blocks b·pages … (b+1)·pages − 1: host arithmetic, no sync)."""
        per_seq = self.block_table.shape[1]
        return [b * per_seq + page for b in range(self.block_table.shape[0])]

    def _write_blocks(self, k, v, n0, n1, kf, vf, slots):
        """Kernel path of a block scheme (kivi2; a page is one key block of T tokens): tokens n0..n1
        of every sequence. The partial last page is held exact in the overlay (radius 0, KIVI's
        full-precision residual, as the reference path serves it); a page is quantized by the write
        kernel when it is full, from its exact values (the held page's pool row, then the new
        tokens), and its held slot is given back (a page the gate repaired stays exact)."""
        from kernels.write import write_kv

        T = self.owner.block_size
        a, c = (n0 // T) * T, (n1 // T) * T  # the page n0 falls in; the end of the full pages
        if n1 > c and c >= n0:  # a new partial last page: held exact from its first token
            self.owner.host_cost.sync("kivi2_hold")
            self.rep.hold(self._page_blocks(c // T))
        self.rep.write(slots // T, slots % T, kf, vf)  # held and repaired pages get the tokens
        if c <= a:
            return
        Bsz, H, m, D = k.shape
        # the page that was partial: its earlier tokens are in its pool row (held, or repaired by the gate)
        rows = self.rep.slot[self.block_table[:, a // T].long()].long() if n0 > a else None  # [B, H], on the device

        def full(x, pool):  # exact values of tokens a..c [B, H, c − a, D]
            old = [pool[rows, : n0 - a].to(x.dtype)] if n0 > a else []
            return torch.cat(old + [x[:, :, : c - n0]], dim=2)

        kfull, vfull = full(k, self.rep.k), full(v, self.rep.v)
        L = c - a
        write_kv(self.paged, kfull.transpose(1, 2).reshape(Bsz * L, H, D), vfull.transpose(1, 2).reshape(Bsz * L, H, D),
                 self.block_table, torch.arange(Bsz, device=self.device).repeat_interleave(L),
                 torch.arange(a, c, device=self.device).repeat(Bsz), store_exact=False, validate=False)
        if n0 > a:
            self.rep.release_held(self._page_blocks(a // T))

    def _append_served(self, k, v):
        o = self.owner
        n0 = self.k_hat.shape[-2]
        Bsz, H, m, D = k.shape
        n1 = n0 + m
        T = o.block_size
        nblk = -(-n1 // T)
        if self.repaired.shape[-1] < nblk:
            pad = torch.zeros(Bsz, H, nblk - self.repaired.shape[-1], dtype=torch.bool, device=self.device)
            self.repaired = torch.cat([self.repaired, pad], dim=-1)
        f64 = dict(dtype=torch.float64, device=self.device)
        self.k_hat = torch.cat([self.k_hat, k.to(self.served_dtype)], dim=-2)
        self.v_hat = torch.cat([self.v_hat, v.to(self.served_dtype)], dim=-2)
        self.k_wit = torch.cat([self.k_wit, torch.zeros(Bsz, H, m, o.num_groups, **f64)], dim=-2)
        self.v_wit = torch.cat([self.v_wit, torch.zeros(Bsz, H, m, **f64)], dim=-1)
        self.k_scale = torch.cat([self.k_scale, torch.zeros(Bsz, H, m, dtype=torch.float32, device=self.device)], dim=-1)
        if self.k_sk is not None:
            self.k_sk = torch.cat([self.k_sk, torch.zeros(Bsz, H, m, D, **f64)], dim=-2)
        if o.scheme == "none":
            self.n_quantized = n1
            return
        # tokens enter exact (the window, KIVI's partial block) and are quantized once they leave it
        lo, b = o.quantized_range(n1)
        a = max(self.n_quantized, lo)
        if b <= a:
            return
        x_k, x_v = self._exact(a, b)
        x_k, x_v = x_k.to(self.device), x_v.to(self.device)
        common = dict(seed=o.seed, layer=self.layer_idx, positions=torch.arange(a, b), block_size=T)
        kh, kmeta = quantize(o.scheme, x_k.float().cpu(), QuantContext(role="key", **common))
        vh, _ = quantize(o.scheme, x_v.float().cpu(), QuantContext(role="value", **common))
        kh, vh = kh.to(self.device, self.served_dtype), vh.to(self.device, self.served_dtype)
        if o.sketch:  # the sketch radius's witness (and sketch): contract.sketch
            r = kh.double() - x_k.double()
            rt = torch.zeros_like(r)
            if o.sketch_bits:
                beta = S.residual_range(o.scheme, kh.double().cpu(), kmeta)
                codes, beta = B.sketch_encode(r.cpu(), o.sketch_bits, beta)
                rt = B.sketch_decode(codes, beta, o.sketch_bits).to(self.device)
            wl = None if o.weights is None else torch.from_numpy(o.weights[self.layer_idx][None]).to(self.device)
            kw = B.sketch_witness(r, rt, wl)[..., None]
        else:
            kw = B.key_witness(x_k.double(), kh.double(), o.groups, block_size=1)
        vw = B.value_witness(x_v.double(), vh.double(), block_size=1)
        # tokens of repaired blocks stay exact (repair is persistent)
        rep = self.repaired.repeat_interleave(T, dim=-1)[..., a:b]
        self.k_hat[..., a:b, :] = torch.where(rep[..., None], x_k.to(self.served_dtype), kh)
        self.v_hat[..., a:b, :] = torch.where(rep[..., None], x_v.to(self.served_dtype), vh)
        self.k_wit[..., a:b, :] = torch.where(rep[..., None], torch.zeros_like(kw), kw)
        self.v_wit[..., a:b] = torch.where(rep, torch.zeros_like(vw), vw)
        if self.k_sk is not None:
            self.k_sk[..., a:b, :] = torch.where(rep[..., None], torch.zeros_like(rt), rt)
        if "scale" in kmeta and o.scheme == "int8_dither":
            self.k_scale[..., a:b] = torch.where(rep, 0.0, kmeta["scale"].to(self.device))
        self.n_quantized = b

    # -- repair
    def page_in(self, b: int, h: int, blk: int) -> int:
        """Make block ``blk`` of (sequence b, kv head h) exact; returns the bytes moved (0 if
        it was already repaired: idempotent). Reads the backing store, never writes it. On the
        kernel path the exact K/V go to the repaired-page overlay (``self.rep``)."""
        if self.paged is not None:
            T = self.owner.block_size
            lo, hi = blk * T, min((blk + 1) * T, self.get_seq_length())
            ek, ev = (x[b, h] for x in self._exact(lo, hi))
            if not self.rep.page_in(int(self.block_table[b, blk]), h, ek, ev):
                return 0
            return 2 * (hi - lo) * ek.shape[-1] * ek.element_size()
        if bool(self.repaired[b, h, blk]):
            return 0
        T = self.owner.block_size
        lo, hi = blk * T, min((blk + 1) * T, self.k_hat.shape[-2])
        ek, ev = (x[b, h].to(self.device, non_blocking=True) for x in self._exact(lo, hi))
        self.k_hat[b, h, lo:hi] = ek.to(self.served_dtype)
        self.v_hat[b, h, lo:hi] = ev.to(self.served_dtype)
        self.k_wit[b, h, lo:hi] = 0
        self.v_wit[b, h, lo:hi] = 0
        self.k_scale[b, h, lo:hi] = 0
        if self.k_sk is not None:
            self.k_sk[b, h, lo:hi] = 0
        self.repaired[b, h, blk] = True
        return 2 * (hi - lo) * ek.shape[-1] * ek.element_size()


class _ExactLayer(DynamicLayer):
    """A layer outside ``compress_layers``: exact KV, base attention, no meter."""

    _pending = None
