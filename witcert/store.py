"""The exact backing store of one layer (SPEC §6): K or V as written, never changed by serving.

    store = ExactStore(batch, heads, head_dim, dtype, device, pin=True)
    store.append(x)        # x [B, H, m, D] on any device: an asynchronous copy, no host sync
    store.read(lo, hi)     # [B, H, hi − lo, D]: tokens lo..hi (after pending appends landed)
    store.data             # [B, H, n, D]: every token written so far (a copy when it spans chunks)

Token-major chunks: the store is a list of buffers [C_i, B, H, D], so the m tokens of an append
land in contiguous slices (a [B, H, capacity, D] buffer makes that slice strided whenever B·H > 1,
and PyTorch copies a device tensor into a strided host destination through a pageable temporary:
a synchronous transfer, i.e. a host sync per layer step for K and again for V).

Growth adds a chunk and copies nothing (the previous single buffer doubled and copied the whole
store: at Llama-8B / B = 8 / 32K, 34 GB of host memcpy, with a host sync first): a new chunk holds
at least what the append needs, ``INITIAL_CAPACITY`` tokens, and a quarter of the capacity so far
(so a request of n tokens has O(log n) chunks and at most ~25 % unused capacity), and an append of
many tokens (a prefill) reserves an eighth more for the decode steps after it. PyTorch's pinned
allocator rounds every allocation up to a power of two bytes, so pinned chunks are sized to fill
their rounded allocation or split below it (``_chunk_tokens``): by that policy's arithmetic (modelled
in tests/test_cache_edges.py, not measured on a GPU) memory stays within ~1.4× of the tokens written
(1.02–1.34× over the shapes there), where the previous single buffer, 1.5× the prefill and then
rounded up, came to ~64 GB of pinned memory for 34 GB of K / V (arithmetic; bench/SERVING.md, run I5).

On a CUDA model the store is pinned host memory and an append is a non-blocking device-to-host
copy on the current stream, with a CUDA event recorded after it. **Every read of the store's bytes
waits for it first** (``wait()``): a host-side read (``.clone()``, ``torch.equal``, a strided
slice's ``.to(cuda)``, which PyTorch first copies into a contiguous host temporary) does not wait
for a pending copy and would see stale memory (found in review, 2026-12-01: the reference path
quantized the prompt from the store right after its append). ``read`` and ``data`` wait; the hot
path (appends, lengths) never does.
"""

from __future__ import annotations

import bisect

import torch

#: tokens of the first chunk at least
INITIAL_CAPACITY = 256
#: a new chunk holds at least 1 / GROWTH of the capacity so far (geometric: O(log n) chunks)
GROWTH = 4
#: an append of m > 1 tokens reserves m / PREFILL_HEADROOM more (the decode steps after a prefill)
PREFILL_HEADROOM = 8


class ExactStore:
    def __init__(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device, pin: bool = False):
        self.shape = (int(batch), int(heads), int(head_dim))
        self.dtype = dtype
        self.device = torch.device(device)
        self.pin = bool(pin) and torch.cuda.is_available()
        self.n = 0
        self._chunks: list[torch.Tensor] = []  # [C_i, B, H, D] each
        self._starts: list[int] = []  # first token index of each chunk
        self._cap = 0
        self._landed = None  # CUDA event after the last asynchronous append (None: nothing pending)

    def _alloc(self, tokens: int) -> torch.Tensor:
        B, H, D = self.shape
        return torch.empty(tokens, B, H, D, dtype=self.dtype, device=self.device, pin_memory=self.pin)

    def _chunk_tokens(self, target: int) -> int:
        """Tokens of a new chunk for a need of ``target``. Pinned, PyTorch's allocator rounds the bytes
        up to a power of two: the chunk takes all the tokens the rounded-up allocation holds when that
        is at most 1/8 more than ``target``; otherwise the largest power of two below (at least half
        the target; ``_reserve`` adds another chunk for the rest), so no allocation hides up to 2×
        of unused memory."""
        if not self.pin:
            return target
        B, H, D = self.shape
        row = B * H * D * torch.empty(0, dtype=self.dtype).element_size()
        nbytes = target * row
        up = 1 << max(0, nbytes - 1).bit_length()  # the allocation a chunk of `target` tokens gets
        if up // row <= target + target // 8:
            return max(target, up // row)
        return max(1, (up // 2) // row)

    def _reserve(self, need: int) -> None:
        while self._cap < need:
            tokens = self._chunk_tokens(max(need - self._cap, INITIAL_CAPACITY, self._cap // GROWTH))
            self._chunks.append(self._alloc(tokens))
            self._starts.append(self._cap)
            self._cap += tokens

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    def _pieces(self, lo: int, hi: int):
        """(chunk, offset in it, token count) covering tokens lo..hi, in order."""
        i = bisect.bisect_right(self._starts, lo) - 1
        while lo < hi:
            c = self._chunks[i]
            off = lo - self._starts[i]
            k = min(hi - lo, c.shape[0] - off)
            yield c, off, k
            lo += k
            i += 1

    def _gather(self, lo: int, hi: int) -> torch.Tensor:
        """Tokens lo..hi token-major [hi − lo, B, H, D] (a view inside one chunk, else a copy); no wait."""
        parts = [c[off: off + k] for c, off, k in self._pieces(lo, hi)]
        if not parts:
            B, H, D = self.shape
            return torch.empty(0, B, H, D, dtype=self.dtype, device=self.device)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 0)

    def _put(self, lo: int, x_tm: torch.Tensor) -> None:
        """Copy token-major ``x_tm`` [m, B, H, D] to tokens lo..lo+m (reserved): one contiguous copy per
        chunk it touches, non-blocking into pinned memory."""
        i = 0
        for c, off, k in self._pieces(lo, lo + x_tm.shape[0]):
            c[off: off + k].copy_(x_tm[i: i + k], non_blocking=self.pin)
            i += k

    def read(self, lo: int, hi: int) -> torch.Tensor:
        """Tokens lo..hi [B, H, hi − lo, D], after every pending append has landed."""
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"ExactStore.read: [{lo}, {hi}) is outside the {self.n} tokens written")
        self.wait()
        return self._gather(lo, hi).permute(1, 2, 0, 3)

    @property
    def data(self) -> torch.Tensor:
        """Every token written [B, H, n, D] (``read(0, n)``: waits for pending appends)."""
        return self.read(0, self.n)

    def __len__(self) -> int:
        return self.n

    def wait(self) -> None:
        """Block the host until every append so far has landed in the buffer (one event sync;
        nothing to do off CUDA or when nothing is pending)."""
        if self._landed is _UNRECORDED:
            raise RuntimeError("ExactStore.wait: an append without record=True was not given its event (append_pair)")
        if self._landed is not None:
            self._landed.synchronize()
            self._landed = None

    def ready(self) -> torch.Tensor:
        """``data`` (it waits): the view to read the store's values through."""
        return self.data

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens (speculative decoding rolls back rejected tokens)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"ExactStore.crop: {n} is outside [0, {self.n}]")
        self.n = n

    def reorder(self, index: torch.Tensor) -> None:
        """Rows ``index`` of the batch (beam search); a copy, pinned again where it was."""
        self.wait()  # pending appends land first
        idx = index.to(self.device)
        new = []
        for c, start in zip(self._chunks, self._starts):
            k = max(0, min(c.shape[0], self.n - start))
            fresh = self._alloc(c.shape[0])
            if k:
                fresh[:k].copy_(c[:k].index_select(1, idx))
            new.append(fresh)
        self._chunks = new

    def append(self, x: torch.Tensor, record: bool = True) -> None:
        """Copy ``x`` [B, H, m, D] after the stored tokens. On CUDA (pinned) the copy is
        asynchronous and, with ``record``, a CUDA event is recorded after it; ``record=False``
        leaves the event to the caller (``append_pair``), who must set it before anyone waits."""
        B, H, m, D = x.shape
        if (B, H, D) != self.shape:
            raise ValueError(f"ExactStore: expected [{self.shape[0]}, {self.shape[1]}, m, {self.shape[2]}], got {tuple(x.shape)}")
        need = self.n + m
        self._reserve(need + (m // PREFILL_HEADROOM if m > 1 else 0))
        self._put(self.n, x.detach().permute(2, 0, 1, 3))
        if self.pin and x.is_cuda:
            if record:
                self._landed = torch.cuda.Event()
                self._landed.record()  # on the current stream, after the copy
            else:
                self._landed = _UNRECORDED
        self.n = need


#: ``ExactStore._landed`` between an unrecorded append and its caller's event (waiting on it is a bug)
_UNRECORDED = object()


def append_pair(k_store: ExactStore, v_store: ExactStore, k: torch.Tensor, v: torch.Tensor) -> None:
    """``k_store.append(k)`` and ``v_store.append(v)`` with one CUDA event, recorded after both
    copies (stream order: it covers the first copy too), shared by the two stores — half the
    event work of two appends on a layer step's hot path."""
    k_store.append(k, record=False)
    v_store.append(v, record=False)
    pending = [st for st in (k_store, v_store) if getattr(st, "_landed", None) is _UNRECORDED]
    if pending:
        ev = torch.cuda.Event()
        ev.record()  # on the current stream, after both copies
        for st in pending:
            st._landed = ev
