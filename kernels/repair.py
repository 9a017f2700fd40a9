"""Repaired pages of a paged cache (SPEC §6, gated caches): a pool of exact pages the decode serves in place
of a page's codes (``decode(..., repair=overlay)``); the codes of a repaired page stay as written.

    slot            [NB, Hkv]      int32: pool row of a repaired page, −1 where not repaired
    k, v            [R + 1, T, D]  the exact values (the cache's model dtype); row R is a scratch row
    k_norm, v_norm  [R + 1, T]     float32 ≥ ‖k_j‖ (κ) / ‖v_j‖ (ν), rounded up; NaN until written
"""

from __future__ import annotations

import dataclasses

import torch

from contract.rounding import round_up_f32

from .fp_bounds import KERNEL_REL_SLACK


@dataclasses.dataclass
class RepairOverlay:
    """Repaired pages of one layer (SPEC §6): a page-in makes page (block, kv head) exact by
    copying its exact K/V from the backing store into a slot of a small pool; the decode reads a
    repaired page's tokens from the pool (scale 1, no dither, key witness 0, φ = 0, ν / κ from
    the pool's norms) instead of its codes. Codes, scales and witnesses of the page stay as written
    (the write path need not know about repairs); the pool is what the decode serves.

        slot    [NB, Hkv]   int32: pool slot of a repaired page, -1 where not repaired
        k, v    [R + 1, T, D] the exact values (model dtype); row R is a scratch row that masked
                            writes land in (never read: no slot points to it)
        k_norm  [R + 1, T]  float32 ≥ ‖k_j‖ (κ), v_norm ≥ ‖v_j‖ (ν): fp64 norms × (1 + KERNEL_REL_SLACK),
                            rounded up into float32; NaN for tokens not yet written, so a decode
                            that reads a pool token nobody wrote (a write into a repaired page
                            without ``write``) saturates and flags its rows instead of serving 0
        count               slots in use (host-side; the pool grows by doubling)
        owner               the storage address of the ``PagedKV`` codes it serves (``bind``);
                            ``validate`` refuses an overlay used with another cache

    The pool's dtype is the cache's model dtype, and ``page_in`` / ``write`` take values of that
    dtype only (a narrower pool would round "exact" values served with radius 0: unsound).

    ``page_in`` fills a slot from exact K/V; ``write`` routes tokens written later into a repaired
    page to its slot too (on the device, no host sync), so a repair stays persistent.

    Block schemes (kivi2) also **hold** the partial last page of a sequence here until it is full
    (``hold``: served exact, radius 0, KIVI's full-precision residual), then quantize it and give
    the slot back (``release_held``). A held page is not a repair: ``held`` maps (block, head) to
    its pool row (host-side, so a release needs no sync), ``free`` lists released rows for reuse;
    a gate's ``page_in`` of a held page turns it into a repair (it then stays exact when full)."""

    slot: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_norm: torch.Tensor
    v_norm: torch.Tensor
    count: int = 0
    owner: int | None = None
    held: dict = dataclasses.field(default_factory=dict)
    free: list = dataclasses.field(default_factory=list)

    @property
    def capacity(self) -> int:
        return self.k.shape[0] - 1

    @staticmethod
    def allocate(num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int, dtype: torch.dtype,
                 device="cpu", capacity: int = 8) -> "RepairOverlay":
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"RepairOverlay: the exact values are bf16 / fp16 / fp32, got {dtype}")
        kw = dict(device=device)
        return RepairOverlay(
            slot=torch.full((num_blocks, num_kv_heads), -1, dtype=torch.int32, **kw),
            k=torch.zeros(capacity + 1, block_size, head_dim, dtype=dtype, **kw),
            v=torch.zeros(capacity + 1, block_size, head_dim, dtype=dtype, **kw),
            k_norm=torch.full((capacity + 1, block_size), float("nan"), dtype=torch.float32, **kw),
            v_norm=torch.full((capacity + 1, block_size), float("nan"), dtype=torch.float32, **kw),
        )

    def bind(self, cache) -> "RepairOverlay":
        """Record which cache (a ``kernels.paged.PagedKV``) this overlay serves (checked by ``validate``); returns self. Call it
        again after the cache is regrouped / reordered (new storage)."""
        self.owner = cache.k_codes.untyped_storage().data_ptr()
        return self

    def validate(self, cache, check_slots: bool = False) -> None:
        """ValueError unless this overlay fits ``cache`` (a ``kernels.paged.PagedKV``: bound to it, shapes, dtypes, devices);
        ``check_slots`` (a device sync): every slot is -1 or a written pool row in [0, count)."""
        if self.owner is None or self.owner != cache.k_codes.untyped_storage().data_ptr():
            raise ValueError("repair: this overlay is not bound to this cache (RepairOverlay.bind(cache)); an overlay "
                             "of another cache would serve its values as exact")
        NB, Hkv = cache.k_codes.shape[:2]
        T, D = cache.block_size, cache.head_dim
        if not isinstance(self.slot, torch.Tensor) or self.slot.dtype != torch.int32 or tuple(self.slot.shape) != (NB, Hkv):
            raise ValueError(f"repair.slot: expected an int32 [{NB}, {Hkv}] tensor, got "
                             f"{getattr(self.slot, 'dtype', type(self.slot))} {tuple(getattr(self.slot, 'shape', ()))}")
        for name in ("k", "v"):
            t = getattr(self, name)
            if t.dim() != 3 or t.shape[1:] != (T, D) or t.shape[0] < 1:
                raise ValueError(f"repair.{name}: expected [R + 1, {T}, {D}], got {tuple(t.shape)}")
            if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                raise ValueError(f"repair.{name}: expected bf16 / fp16 / fp32 exact values, got {t.dtype}")
        if self.v.shape != self.k.shape or self.v.dtype != self.k.dtype:
            raise ValueError("repair.k, repair.v: expected the same shape and dtype")
        for name in ("k_norm", "v_norm"):
            t = getattr(self, name)
            if t.dtype != torch.float32 or tuple(t.shape) != tuple(self.k.shape[:2]):
                raise ValueError(f"repair.{name}: expected a float32 {list(self.k.shape[:2])} tensor, got {t.dtype} "
                                 f"{tuple(t.shape)}")
        for name in ("slot", "k", "v", "k_norm", "v_norm"):
            t = getattr(self, name)
            if t.device != cache.k_codes.device:
                raise ValueError(f"repair.{name}: on {t.device}, the cache is on {cache.k_codes.device}")
            if not t.is_contiguous():
                raise ValueError(f"repair.{name}: expected a contiguous tensor")
        if not 0 <= self.count <= self.capacity:
            raise ValueError(f"repair.count: {self.count} is outside [0, {self.capacity}]")
        if self.k.dtype != cache.exact_k.dtype:
            raise ValueError(f"repair.k: the exact pool must hold the cache's model dtype {cache.exact_k.dtype}, got "
                             f"{self.k.dtype} (a narrower pool rounds values served as exact)")
        if check_slots and bool(((self.slot < -1) | (self.slot >= self.count)).any()):
            raise ValueError(f"repair.slot: every slot must be -1 or a pool row in [0, count = {self.count})")

    @staticmethod
    def norms_up(x: torch.Tensor) -> torch.Tensor:
        """‖x_j‖ over the last dim, an upper bound in float32: the fp64 norm (of values exact in
        fp64) inflated by KERNEL_REL_SLACK and rounded up (no host sync)."""
        return round_up_f32(torch.linalg.vector_norm(x.double(), dim=-1) * (1.0 + KERNEL_REL_SLACK))

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self.capacity)
        for name in ("k", "v", "k_norm", "v_norm"):
            t = getattr(self, name)
            new = torch.zeros((cap + 1,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
            if name in ("k_norm", "v_norm"):
                new.fill_(float("nan"))  # not written yet (the class doc)
            new[: self.count] = t[: self.count]
            setattr(self, name, new)

    def _new_row(self) -> int:
        """A pool row for a new slot: a released one, else the next (the pool grows by doubling)."""
        if self.free:
            return self.free.pop()
        if self.count == self.capacity:
            self._grow(self.count + 1)
        self.count += 1
        return self.count - 1

    def hold(self, blocks: list, k: torch.Tensor | None = None, v: torch.Tensor | None = None) -> int:
        """Hold pages ``blocks`` (every kv head) exact in the pool until ``release_held``: the partial
        last page of a block scheme's sequence. ``k``, ``v`` [len(blocks), Hkv, m, D]: the exact values
        of their first m tokens (None: m = 0, ``write`` fills them as they arrive). A page that has a
        slot already (held, or repaired by the gate) is left as it is. One host sync (which pages have
        slots). Returns the number of pages newly held."""
        H = self.slot.shape[1]
        if not blocks:
            return 0
        has = (self.slot[torch.as_tensor(blocks, dtype=torch.long, device=self.slot.device)] >= 0).cpu()
        bl, hd, rows, src = [], [], [], []
        for i, b in enumerate(blocks):
            for h in range(H):
                if bool(has[i, h]):
                    continue
                r = self._new_row()
                self.held[(int(b), h)] = r
                bl.append(int(b))
                hd.append(h)
                rows.append(r)
                src.append((i, h))
        if not rows:
            return 0
        dev = self.k.device
        ri = torch.tensor(rows, dtype=torch.long, device=dev)
        for name in ("k", "v"):
            getattr(self, name)[ri] = 0
        for name in ("k_norm", "v_norm"):
            getattr(self, name)[ri] = float("nan")  # not written yet (the class doc)
        if k is not None and k.shape[2] > 0:
            m = k.shape[2]
            if k.dtype != self.k.dtype or v.dtype != self.v.dtype:
                raise ValueError(f"hold: exact values of the pool's dtype {self.k.dtype} only, got {k.dtype} / {v.dtype}")
            ii = torch.tensor([a for a, _ in src], dtype=torch.long, device=k.device)
            hh = torch.tensor([b for _, b in src], dtype=torch.long, device=k.device)
            kk, vv = k[ii, hh].to(dev), v[ii, hh].to(dev)  # [P, m, D]
            self.k[ri, :m] = kk
            self.v[ri, :m] = vv
            self.k_norm[ri, :m] = self.norms_up(kk)
            self.v_norm[ri, :m] = self.norms_up(vv)
        self.slot[torch.tensor(bl, dtype=torch.long, device=self.slot.device),
                  torch.tensor(hd, dtype=torch.long, device=self.slot.device)] = \
            torch.tensor(rows, dtype=torch.int32, device=self.slot.device)
        return len(rows)

    def release_held(self, blocks: list) -> int:
        """Give back the held slots of pages ``blocks`` (every kv head; pages the gate repaired stay):
        the page is now served from its codes. No host sync. Returns the number released."""
        bl, hd = [], []
        for b in blocks:
            for h in range(self.slot.shape[1]):
                r = self.held.pop((int(b), h), None)
                if r is not None:
                    self.free.append(r)
                    bl.append(int(b))
                    hd.append(h)
        if bl:
            dev = self.slot.device
            self.slot[torch.tensor(bl, dtype=torch.long, device=dev), torch.tensor(hd, dtype=torch.long, device=dev)] = -1
        return len(bl)

    def page_in(self, block: int, head: int, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Make page (``block``, ``head``) exact: its first m tokens' exact K/V ``k``, ``v`` [m, D]
        (m ≤ T; the rest of the page is filled by ``write`` as tokens arrive). Returns False
        (nothing done) if the page is already repaired: idempotent. A held page (``hold``) becomes
        a repair (its values are copied again: they are the same)."""
        NB, H = self.slot.shape
        if not (0 <= block < NB and 0 <= head < H):
            raise ValueError(f"page_in: block {block}, head {head} outside [0, {NB}) x [0, {H})")
        m = k.shape[0]
        if k.shape != v.shape or k.dim() != 2 or m > self.k.shape[1] or k.shape[1] != self.k.shape[2]:
            raise ValueError(f"page_in: expected k, v [m ≤ {self.k.shape[1]}, {self.k.shape[2]}], got "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        if k.dtype != self.k.dtype or v.dtype != self.v.dtype:
            raise ValueError(f"page_in: exact values of the pool's dtype {self.k.dtype} only, got {k.dtype} / {v.dtype}")
        r = self.held.pop((int(block), int(head)), None)
        if r is None:
            if int(self.slot[block, head]) >= 0:
                return False
            r = self._new_row()
        dev = self.k.device
        k = k.to(dev)
        v = v.to(dev)
        self.k[r].zero_()
        self.v[r].zero_()
        self.k_norm[r].fill_(float("nan"))  # tokens m.. are not written yet
        self.v_norm[r].fill_(float("nan"))
        self.k[r, :m] = k
        self.v[r, :m] = v
        self.k_norm[r, :m] = self.norms_up(self.k[r, :m])  # the norms of what is stored and served
        self.v_norm[r, :m] = self.norms_up(self.v[r, :m])
        self.slot[block, head] = r
        return True

    def write(self, blocks: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Tokens just written into the paged cache at (``blocks`` [N], ``offsets`` [N]) with exact
        ``k``, ``v`` [N, Hkv, D]: those in a repaired page go to its pool slot too (a gather and a
        scatter on the device, no host sync; tokens of pages not repaired land in the scratch row)."""
        if k.dtype != self.k.dtype or v.dtype != self.v.dtype:
            raise ValueError(f"write: exact values of the pool's dtype {self.k.dtype} only, got {k.dtype} / {v.dtype}")
        if self.count == 0 or k.shape[0] == 0:
            return
        R = self.capacity
        dev = self.k.device
        blocks = blocks.to(dev, torch.int64)
        offsets = offsets.to(dev, torch.int64)
        s = self.slot[blocks].to(torch.int64)  # [N, Hkv]
        s = torch.where(s >= 0, s, torch.full_like(s, R))
        off = offsets[:, None].expand_as(s)
        k = k.to(dev)
        v = v.to(dev)
        self.k[s, off] = k
        self.v[s, off] = v
        self.k_norm[s, off] = self.norms_up(k)  # k is of the pool's dtype: the stored values' norms
        self.v_norm[s, off] = self.norms_up(v)

    def regrouped(self, batch: int, old_pages: int, new_pages: int) -> "RepairOverlay":
        """``PagedKV.regrouped``'s block move (b·old + j → b·new + j) applied to ``slot``."""
        H = self.slot.shape[1]
        new = torch.full((batch, new_pages, H), -1, dtype=torch.int32, device=self.slot.device)
        new[:, :old_pages] = self.slot.view(batch, old_pages, H)
        held = {((b // old_pages) * new_pages + b % old_pages, h): r for (b, h), r in self.held.items()}
        return dataclasses.replace(self, slot=new.view(batch * new_pages, H), owner=None,  # bind to the new cache
                                   held=held, free=list(self.free))

    def reordered(self, batch: int, pages: int, index: torch.Tensor) -> "RepairOverlay":
        """``PagedKV.reordered`` (sequence b owns what ``index[b]`` owned) with the pool copied, so
        beams never share a slot that a later write into one of them would change under the other."""
        H = self.slot.shape[1]
        index = index.to(self.slot.device)
        src = self.slot.view(batch, pages, H).index_select(0, index).reshape(-1)
        used = src >= 0
        n = int(used.sum())
        out = RepairOverlay.allocate(batch * pages, H, self.k.shape[1], self.k.shape[2], self.k.dtype, self.k.device,
                                     capacity=max(n, 1))
        flat = torch.full_like(src, -1)
        flat[used] = torch.arange(n, dtype=torch.int32, device=src.device)
        rows = src[used].long()
        for name in ("k", "v", "k_norm", "v_norm"):
            getattr(out, name)[:n] = getattr(self, name)[rows]
        out.slot = flat.view(batch * pages, H)
        out.count = n
        if self.held:  # a held page stays held in its copy (host-side map: one transfer, beam search only)
            idx = index.cpu().tolist()
            fl = flat.cpu().tolist()
            for b in range(batch):
                for j in range(pages):
                    for h in range(H):
                        if (idx[b] * pages + j, h) in self.held:
                            out.held[(b * pages + j, h)] = fl[(b * pages + j) * H + h]
        return out
