"""Token slots the decode must not vouch for (issue 36): ``decode(..., unmetered=UnmeteredSlots(...))``.

    slots  [P] uint8 (or bool)   1: the slot's witness is not valid (written by a path the caller did not record)
    every  [1] uint8 (or bool)   1: no slot is (e.g. the buffer's scales differ from the witnesses')

CSR rows only (SGLang's layout: ``block_table`` is the flat ``kv_indices``, each entry a slot of a P-row pool). The
decode kernel counts, per row, the attended tokens whose slot is marked or lies outside [0, P) (its bytes are no
token's: slot P − 1 is read in its place, never out of bounds) with the non-finite witnesses, so the merge gives the row
the non-finite record (TV⁺ 1, output bound +inf, flagged) in the same launches: no torch op, no host sync,
capturable in a CUDA graph. In the tile loop: the marks' byte load and an unsigned clamp of the slot, no select and
no mask that depends on the slot; the forms measured slower (a mask, a select on the int64 slot, a pass after the loop)
are in ``decode_kernel``'s comment and bench/SGLANG.md (run X); ``tests/kernels/test_kernel_codegen.py`` checks the
schedule.
"""

from __future__ import annotations

import dataclasses

import torch

_FLAG_DTYPES = (torch.uint8, torch.bool)


@dataclasses.dataclass(frozen=True)
class UnmeteredSlots:
    slots: torch.Tensor  # [P] one byte per pool slot
    every: torch.Tensor  # [1] one byte

    @classmethod
    def of(cls, slots: torch.Tensor, every: torch.Tensor | None = None) -> "UnmeteredSlots":
        """From bool / uint8 flags (viewed as uint8, no copy); ``every`` None: a zero byte on the slots' device."""
        if every is None:
            every = torch.zeros(1, dtype=torch.uint8, device=slots.device)
        return cls(slots=_as_bytes(slots, "slots"), every=_as_bytes(every.reshape(-1), "every"))

    def check(self, csr: bool, meter: bool, device, pool_rows: int) -> None:
        """Refuse what the kernel cannot count soundly or would read out of bounds: a block table (pages, not slots),
        ``meter=False``, other shapes / dtypes / devices, an empty pool, and more rows than the cache's ``pool_rows``
        slots (the kernel reads slot P − 1 of the cache in an outside slot's place; fewer rows are allowed: the slots
        past them count as outside)."""
        if not csr:
            raise ValueError("unmetered: token slots are CSR rows' (kv_indptr); a block table's entries are pages")
        if not meter:
            raise ValueError("unmetered: counted by the meter (meter=False would serve the rows unflagged)")
        if self.slots.dim() != 1 or self.slots.shape[0] < 1 or self.every.shape != (1,):
            raise ValueError(f"unmetered: slots [P ≥ 1] and every [1], got {tuple(self.slots.shape)} and "
                             f"{tuple(self.every.shape)}")
        if self.slots.shape[0] > pool_rows:
            raise ValueError(f"unmetered: {self.slots.shape[0]} slots for a cache of {pool_rows} (the kernel would "
                             "read past the cache in an outside slot's place)")
        for name, t in (("slots", self.slots), ("every", self.every)):
            if t.dtype != torch.uint8 or not t.is_contiguous() or t.device != torch.device(device):
                raise ValueError(f"unmetered.{name}: expected contiguous uint8 on {device}, got {t.dtype} on "
                                 f"{t.device} (UnmeteredSlots.of views bool flags as uint8)")


def _as_bytes(t: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype not in _FLAG_DTYPES:
        raise ValueError(f"unmetered.{name}: expected a bool or uint8 tensor, got "
                         f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"unmetered.{name}: expected a contiguous tensor (the kernel reads it in place)")
    return t.view(torch.uint8)
