"""The exact backing store of one layer (SPEC §6): K or V as written, never changed by serving.

    store = ExactStore(batch, heads, head_dim, dtype, device, pin=True)
    store.append(x)        # x [B, H, m, D] on any device: an asynchronous copy, no host sync
    store.data             # [B, H, n, D] view of the n tokens written so far

Token-major: the buffer is [capacity, B, H, D], so the m tokens of an append land in one
contiguous slice. (A [B, H, capacity, D] buffer makes that slice strided whenever B·H > 1, and
PyTorch copies a device tensor into a strided host destination through a pageable temporary:
a synchronous transfer, i.e. a host sync per layer step for K and again for V.)

Preallocated with geometric growth (capacity at least doubles, and a growth leaves half the
needed size as headroom, so the decode steps after a long prefill do not grow it), so a
decode step costs O(m) copies, not
O(context): the previous ``torch.cat`` + ``pin_memory`` per step and layer copied the whole
store every step. On a CUDA model the store is pinned host memory and an append is a
non-blocking device-to-host copy on the current stream, with a CUDA event recorded after it.
**Every read of the store's bytes must call ``wait()`` first**: a host-side read (``.clone()``,
``torch.equal``, or a strided slice's ``.to(cuda)``, which PyTorch first copies into a contiguous
host temporary) does not wait for a pending copy and would see stale memory (found in review,
2026-12-01: the reference path quantized the prompt from the store right after its append).
``data`` itself does not wait (the hot path takes views of it every layer step); growth and
``reorder`` wait (their host-side copies read the old contents).
"""

from __future__ import annotations

import torch

#: tokens allocated at the first append (then doubled as needed)
INITIAL_CAPACITY = 256


class ExactStore:
    def __init__(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device, pin: bool = False):
        self.shape = (int(batch), int(heads), int(head_dim))
        self.dtype = dtype
        self.device = torch.device(device)
        self.pin = bool(pin) and torch.cuda.is_available()
        self.n = 0
        self._buf = self._alloc(0)
        self._landed = None  # CUDA event after the last asynchronous append (None: nothing pending)

    def _alloc(self, capacity: int) -> torch.Tensor:
        B, H, D = self.shape
        return torch.empty(capacity, B, H, D, dtype=self.dtype, device=self.device, pin_memory=self.pin)

    @property
    def capacity(self) -> int:
        return self._buf.shape[0]

    @property
    def data(self) -> torch.Tensor:
        return self._buf[: self.n].permute(1, 2, 0, 3)

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
        """``data`` after ``wait()``: the view to read the store's values through."""
        self.wait()
        return self.data

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens (speculative decoding rolls back rejected tokens)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"ExactStore.crop: {n} is outside [0, {self.n}]")
        self.n = n

    def reorder(self, index: torch.Tensor) -> None:
        """Rows ``index`` of the batch (beam search); a copy, pinned again where it was."""
        self.wait()  # pending appends land first
        new = self._alloc(self.capacity)
        new[: self.n].copy_(self._buf[: self.n].index_select(1, index.to(self._buf.device)))
        self._buf = new

    def append(self, x: torch.Tensor, record: bool = True) -> None:
        """Copy ``x`` [B, H, m, D] after the stored tokens. On CUDA (pinned) the copy is
        asynchronous and, with ``record``, a CUDA event is recorded after it; ``record=False``
        leaves the event to the caller (``append_pair``), who must set it before anyone waits."""
        B, H, m, D = x.shape
        if (B, H, D) != self.shape:
            raise ValueError(f"ExactStore: expected [{self.shape[0]}, {self.shape[1]}, m, {self.shape[2]}], got {tuple(x.shape)}")
        need = self.n + m
        if need > self.capacity:
            # double, and leave at least half the need as headroom: a prefill of n tokens is
            # followed by decode steps, which must not pay a growth (a pinned re-allocation)
            cap = max(INITIAL_CAPACITY, 2 * self.capacity, need + need // 2)
            new = self._alloc(cap)
            if self.n:
                self.wait()  # pending appends land in the old buffer before it is copied
                new[: self.n].copy_(self._buf[: self.n])
            self._buf = new
        # one contiguous destination slice: a single asynchronous copy into pinned memory
        self._buf[self.n : need].copy_(x.detach().permute(2, 0, 1, 3), non_blocking=self.pin)
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
