"""Paged KV layout shared by every kernel (SPEC §1, §8).

Shapes (one layer; NB physical blocks of T tokens; Hkv kv heads; head dim D; G groups):

    k_codes, v_codes  [NB, Hkv, T, D]   int8 (int8, int8_dither), fp8 (raw / scaled), or the
                                        model dtype (scheme "none")
    k_codes, v_codes  [NB, Hkv, T, D/2] uint8 for int4_group: byte i holds channel i (low nibble)
                                        and channel i + D/2 (high nibble), the RoPE 'half' pairing
    k_scale, v_scale  [NB, Hkv, T]      float16, rounded up (1.0 where a scheme has no scale);
                      [NB, Hkv, T, D/32] for int4_group, with k_zero / v_zero of the same shape
    kivi2             k_codes, v_codes [NB, Hkv, T, D/4] uint8: byte i holds channels i, i + D/4,
                      i + D/2, i + 3D/4 in bits 0-1, 2-3, 4-5, 6-7 (``unpack_codes``); k_scale,
                      k_zero [NB, Hkv, D] (per channel of a page: a page is one block of T tokens,
                      quantized when it is full); v_scale, v_zero [NB, Hkv, T, D/32] (as int4_group)
    k_wit             [NB, Hkv, TW, G]  key witnesses ≥ ‖r_j[g]‖ (TW = T per token, 1 per block)
    v_wit             [NB, Hkv, TW]     value witnesses ≥ ‖f_j‖
    v_norm            [NB, Hkv, TN]     ν ≥ ‖v̂_j‖ (int8_dither: ≥ s(‖c‖ + ‖u‖), the magnitudes the
                                        decode's split dot products add up)
    k_norm            [NB, Hkv, TN]     κ ≥ ‖k̂_j‖ (int8_dither: ≥ s(‖c‖ + ‖u‖)): the decode's
                                        logit-rounding radius Ξ is σ‖q_h‖·max κ·γ (SPEC §7)
                                        (TN = TW, or 1 with ``block_norms``: the decode reads ν and κ
                                        only through their maxima over a split, so one float32
                                        running max per page serves it; 3.5 B a token less at T 16)
    exact_k, exact_v  [NB, Hkv, T, D]   the exact backing store (model dtype); the serving path
                                        never writes it after the token's write
    block_table       [B, max_blocks]   int32 physical block ids per sequence
    seq_lens          [B]               int32

Per-token witnesses are stored in float16 rounded up; per-block witnesses (and per-block norms) in
float32, updated with an atomic running max, so a block can be filled over several writes. A running
max only grows: a block that is rewritten (a cropped sequence, a kivi2 page re-quantized when full)
keeps the larger of its old and new maxima, which still bounds every token it holds.

Beside the layout: the repaired pages (``kernels.repair.RepairOverlay``, SPEC §6), the exact window
(``kernels.exact_window.ExactWindow``), the kernels' floating-point constants and bounds (``kernels.fp_bounds``,
SPEC §7) and the memory accounting (``kernels.memory_accounting.bytes_per_token``).
"""

from __future__ import annotations

import dataclasses

import torch

from contract.bands import group_slices
from contract.schemes import INT4_GROUP, KERNEL_SCHEME_IDS, SCHEMES
from contract.sketch import check_bits

#: scheme ids shared by the kernels (constexpr SCHEME), from the scheme table (re-exported)
SCHEME_IDS = dict(KERNEL_SCHEME_IDS)
#: the storage dtype of each kernel scheme's codes ("none" stores the model dtype)
CODE_DTYPES = {name: getattr(torch, SCHEMES[name].code_dtype) for name in SCHEME_IDS if SCHEMES[name].code_dtype}
SUPPORTED_HEAD_DIMS = (64, 128, 256)


def unpack_codes(codes: torch.Tensor, scheme: str) -> torch.Tensor:
    """The codes [..., D] (int64) of packed bytes [..., D / codes_per_byte] (torch; the kernels unpack
    in-kernel): byte i holds channel i + k·D/c in bits k·b … k·b + b − 1 (c codes of b bits per
    byte; int4_group: i and i + D/2, kivi2: i, i + D/4, i + D/2, i + 3D/4). Unpacked schemes pass."""
    row = SCHEMES[scheme]
    c = codes.long()
    if row.codes_per_byte == 1:
        return c
    b = row.code_bits
    return torch.cat([(c >> (k * b)) & ((1 << b) - 1) for k in range(row.codes_per_byte)], dim=-1)


def page_scaled_keys(scheme: str) -> bool:
    """Whether a scheme's key scale / zero is one per channel of a page (the table's key scale kind
    "channel-block": kivi2, a page is one key block): stored [NB, Hkv, D] (stride 0 over the
    page's tokens), written by one program per page."""
    return SCHEMES[scheme].key_scales == "channel-block"


def dequantized_fp32(scheme: str) -> bool:
    """Whether the decode dequantizes a scheme's tiles as z + s·c in fp32 and dots them with tf32x3
    (``dot_gamma(..., split3=True)``): the asymmetric schemes (a zero beside each scale: int4_group,
    kivi2)."""
    row = SCHEMES[scheme]
    return row.key_scales in ("group", "channel-block")



def _group_ids(head_dim: int, num_groups: int, rotary_dim: int | None, layout: str) -> torch.Tensor:
    """[D] int32: the group of each channel (``contract.bands.group_slices``)."""
    groups = group_slices(head_dim, num_groups, rotary_dim, layout)
    gid = torch.empty(head_dim, dtype=torch.int32)
    for g, idx in enumerate(groups):
        gid[torch.from_numpy(idx)] = g
    return gid


def _scale_shape(kind: str, shape: tuple) -> tuple:
    """The scale (and zero) layout of one role, from the table's scale kind; ``shape`` (NB, Hkv, T, D)."""
    if kind == "group":  # one scale / zero per INT4_GROUP channels of a token
        return shape[:3] + (shape[3] // INT4_GROUP,)
    if kind == "channel-block":  # kivi2 keys: one per channel of a page (= a block of T tokens)
        return (shape[0], shape[1], shape[3])
    return shape[:3]


def _channel_weights(weights, num_kv_heads: int, head_dim: int, device) -> tuple[torch.Tensor, bool]:
    """(weights [Hkv, D] float32 on ``device``, whether one is not 1): the sketch radius's channel weights
    (None: all 1), checked to be positive, finite powers of two. The checks run on the host copy before it
    goes to the device (a check of a device tensor, or a copy from pageable memory, waits for the GPU's
    queue: at a prefill that is once per layer, bench/SERVING.md "prefill profile"); None is made on the
    device."""
    if weights is None:
        return torch.ones(num_kv_heads, head_dim, dtype=torch.float32, device=device), False
    w = torch.as_tensor(weights, dtype=torch.float32).detach()
    w = w.cpu() if w.device.type != "cpu" else w  # a device tensor: one wait, here, at allocation
    if tuple(w.shape) != (num_kv_heads, head_dim):
        raise ValueError(f"weights: expected [{num_kv_heads}, {head_dim}] channel weights, got {tuple(w.shape)}")
    if not bool(torch.all(torch.isfinite(w) & (w > 0))):
        raise ValueError("weights: every channel weight must be positive and finite")
    mant, _ = torch.frexp(w)
    if not bool(torch.all(mant == 0.5)):
        raise ValueError("weights: every channel weight must be a power of two (exact products and quotients)")
    return to_device_async(w, device), bool((w != 1).any())


def to_device_async(host: torch.Tensor, device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the GPU: a copy from pageable memory waits for
    the stream's queue (at a prefill, once per layer: bench/SERVING.md "prefill profile"); from pinned
    memory it is asynchronous (PyTorch's caching host allocator keeps the pinned copy until it lands)."""
    dev = torch.device(device)
    if dev.type == "cuda" and host.device.type == "cpu":
        return host.contiguous().pin_memory().to(dev, non_blocking=True)
    return host.contiguous().to(dev)


@dataclasses.dataclass
class PagedKV:
    scheme: str
    block_size: int
    num_groups: int
    per_token_witness: bool
    group_id: torch.Tensor  # [D] int32: group of each channel
    k_codes: torch.Tensor
    v_codes: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    k_zero: torch.Tensor
    v_zero: torch.Tensor
    k_wit: torch.Tensor
    v_wit: torch.Tensor
    v_norm: torch.Tensor
    k_norm: torch.Tensor
    exact_k: torch.Tensor
    exact_v: torch.Tensor
    seed: int = 0
    layer: int = 0
    #: the key residual sketch (``contract.sketch``): bits per channel (0: none), the packed codes
    #: [NB, Hkv, T, D·bits/8] uint8 (a (1,) placeholder without), and the channel weights [Hkv, D]
    #: float32 (powers of two; all 1: plain Cauchy–Schwarz). With either, ``k_wit`` holds the sketch
    #: witness W_j ≥ ‖(r_j − r̃_j)/a‖ + γ‖r̃_j/a‖ (G = 1)
    sketch_bits: int = 0
    k_sketch: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    #: whether ``weights`` has a channel weight other than 1 (decided once, at allocation: no device sync later)
    has_weights: bool = False
    #: the decode bins one key level per (token, query head) -- the per-head sketch radius
    #: ε_hj = c_h W_j + |σ⟨q_h, r̃_j⟩| -- instead of one per token for a kv head's query heads (the shared radius
    #: c_h (W_j + max_h |σ⟨q_h, r̃_j⟩| / c_h)); only with the sketch radius (``weighted``)
    head_levels: bool = False
    #: ν and κ (``v_norm``, ``k_norm``) as one float32 running max per page ([NB, Hkv, 1]) instead of one
    #: float16 per token: the decode reads them only through a split's maxima (``_decode_kernel``'s numax,
    #: kapmax), so the bound is the same up to the page's other tokens (a window token's norm, a partial split)
    block_norms: bool = False

    def __post_init__(self):
        # every construction (allocate, dataclasses.replace, an adapter's view) gets the norms' layout checked once,
        # not every write / decode call
        self.check_norms()

    @property
    def norms_per_token(self) -> bool:
        """Whether ``v_norm`` / ``k_norm`` hold one entry per token (else one per page)."""
        return self.per_token_witness and not self.block_norms

    @property
    def weighted(self) -> bool:
        """Whether the key radius is the sketch radius (a sketch, or channel weights other than 1)."""
        return self.sketch_bits > 0 or self.has_weights

    @property
    def num_kv_heads(self) -> int:
        return self.k_codes.shape[1]

    @property
    def head_dim(self) -> int:
        return self.group_id.numel()

    @staticmethod
    def allocate(
        num_blocks: int,
        num_kv_heads: int,
        head_dim: int,
        scheme: str = "int8",
        block_size: int = 16,
        num_groups: int = 4,
        per_token_witness: bool = True,
        model_dtype: torch.dtype = torch.bfloat16,
        device="cpu",
        rotary_dim: int | None = None,
        layout: str = "half",
        seed: int = 0,
        layer: int = 0,
        with_exact: bool = True,
        sketch_bits: int = 0,
        weights: torch.Tensor | None = None,
        head_levels: bool = False,
        block_norms: bool = False,
    ) -> "PagedKV":
        """A zeroed cache of ``num_blocks`` pages (the shapes of the module doc); ValueError on a scheme, head dim,
        block size or channel weights the kernels do not support, or ``head_levels`` without the sketch radius.
        ``block_norms``: ν, κ as one float32 running max per page (the module doc)."""
        sketch_bits = check_bits(sketch_bits)
        if scheme not in SCHEME_IDS:
            raise ValueError(f"scheme: the kernels support {sorted(SCHEME_IDS)}, got {scheme!r}")
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim: the kernels support {SUPPORTED_HEAD_DIMS}, got {head_dim}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size: must be a power of two, got {block_size}")
        gid = _group_ids(head_dim, num_groups, rotary_dim, layout)
        row = SCHEMES[scheme]
        cdt = CODE_DTYPES.get(scheme, model_dtype)
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        cshape = shape[:3] + (head_dim // row.codes_per_byte,)  # int4_group: two codes per byte, kivi2 four
        ksshape, vsshape = _scale_shape(row.key_scales, shape), _scale_shape(row.value_scales, shape)
        asym = ("group", "channel-block")  # asymmetric schemes store a zero beside each scale
        tw = block_size if per_token_witness else 1
        wdt = torch.float16 if per_token_witness else torch.float32
        if not isinstance(block_norms, bool):
            raise ValueError(f"block_norms: expected a bool, got {block_norms!r}")
        block_norms = block_norms and per_token_witness  # without per-token witnesses every witness is per page
        tn, ndt = (1, torch.float32) if block_norms else (tw, wdt)
        kw = dict(device=device)
        weights, has_weights = _channel_weights(weights, num_kv_heads, head_dim, device)
        if (sketch_bits or has_weights) and (num_groups != 1 or not per_token_witness):
            raise ValueError("sketch_bits / weights: the sketch radius takes one per-token witness (num_groups=1, "
                             "per_token_witness=True)")
        if sketch_bits and scheme == "none":
            sketch_bits = 0  # an exact cache has no residual to sketch
        if not isinstance(head_levels, bool):
            raise ValueError(f"head_levels: expected a bool, got {head_levels!r}")
        if head_levels and not (sketch_bits or has_weights):
            raise ValueError("head_levels: per-head key levels are the sketch radius's (a key sketch or channel "
                             "weights); without one every head has the same radius")
        ksk = (torch.zeros(num_blocks, num_kv_heads, block_size, head_dim * sketch_bits // 8, dtype=torch.uint8, **kw)
               if sketch_bits else torch.zeros(1, dtype=torch.uint8, **kw))
        return PagedKV(
            scheme=scheme,
            block_size=block_size,
            num_groups=num_groups,
            per_token_witness=per_token_witness,
            group_id=to_device_async(gid, device),
            k_codes=torch.zeros(cshape, dtype=cdt, **kw),
            v_codes=torch.zeros(cshape, dtype=cdt, **kw),
            k_scale=torch.ones(ksshape, dtype=torch.float16, **kw),
            v_scale=torch.ones(vsshape, dtype=torch.float16, **kw),
            k_zero=torch.zeros(ksshape if row.key_scales in asym else (1,), dtype=torch.float16, **kw),
            v_zero=torch.zeros(vsshape if row.value_scales in asym else (1,), dtype=torch.float16, **kw),
            k_wit=torch.zeros(num_blocks, num_kv_heads, tw, num_groups, dtype=wdt, **kw),
            v_wit=torch.zeros(num_blocks, num_kv_heads, tw, dtype=wdt, **kw),
            v_norm=torch.zeros(num_blocks, num_kv_heads, tn, dtype=ndt, **kw),
            k_norm=torch.zeros(num_blocks, num_kv_heads, tn, dtype=ndt, **kw),
            # with_exact=False (benchmarks only): a 1-element placeholder, never read by decode
            exact_k=torch.zeros(shape if with_exact else (1,), dtype=model_dtype, **kw),
            exact_v=torch.zeros(shape if with_exact else (1,), dtype=model_dtype, **kw),
            seed=seed,
            layer=layer,
            sketch_bits=sketch_bits,
            k_sketch=ksk,
            weights=weights,
            has_weights=has_weights,
            head_levels=head_levels,
            block_norms=block_norms,
        )

    #: tensors with one row per physical block (placeholders of shape (1,) are left alone)
    BLOCK_FIELDS = ("k_codes", "v_codes", "k_scale", "v_scale", "k_zero", "v_zero", "k_wit", "v_wit", "v_norm",
                    "k_norm", "exact_k", "exact_v", "k_sketch")

    def _per_sequence(self, batch: int, pages: int, fn, what: str) -> "PagedKV":
        """Apply ``fn(name, t [batch, pages, ...]) -> [batch', pages', ...]`` to every per-block
        tensor of a cache whose sequence b owns blocks b·pages … (b+1)·pages − 1."""
        nb = self.k_codes.shape[0]
        if nb != batch * pages:
            raise ValueError(f"{what}: {nb} blocks are not {batch} sequences x {pages} pages")
        fields = {}
        for name in self.BLOCK_FIELDS:
            t = getattr(self, name)
            if t.dim() >= 1 and t.shape[0] == nb and not (nb == 1 and t.dim() == 1):
                out = fn(name, t.view(batch, pages, *t.shape[1:]))
                fields[name] = out.reshape(out.shape[0] * out.shape[1], *t.shape[1:])
        return dataclasses.replace(self, **fields)

    def regrouped(self, batch: int, old_pages: int, new_pages: int) -> "PagedKV":
        """A copy with room for ``new_pages`` pages per sequence: block b·old_pages + j moves to
        b·new_pages + j. Codes, scales, witnesses and norms move bit for bit (the dither is keyed
        by the logical index, which does not change)."""
        if new_pages < old_pages:
            raise ValueError("regrouped: a cache never shrinks")

        def grow(name, t):
            new = torch.zeros((t.shape[0], new_pages) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device)
            if name in ("k_scale", "v_scale"):
                new.fill_(1.0)
            new[:, :old_pages] = t
            return new

        return self._per_sequence(batch, old_pages, grow, "regrouped")

    def reordered(self, batch: int, pages: int, index: torch.Tensor) -> "PagedKV":
        """A copy in which sequence b owns what sequence ``index[b]`` owned (beam search). Copies,
        so beams never share a block that a later write would change under the other."""
        return self._per_sequence(batch, pages, lambda name, t: t.index_select(0, index.to(t.device)), "reordered")

    def check_norms(self) -> None:
        """ValueError unless ``v_norm`` and ``k_norm`` have the layout the kernels index (one stride pair for both):
        [NB, Hkv, T] float16 per token, or [NB, Hkv, 1] float32 per page (``block_norms``, per-block witnesses).
        Run at every construction (``__post_init__``); a tensor assigned to a built cache afterwards is not checked."""
        nb, h = self.k_codes.shape[:2]
        want = (h, self.block_size if self.norms_per_token else 1)
        dt = torch.float16 if self.norms_per_token else torch.float32
        for name in ("v_norm", "k_norm"):
            t = getattr(self, name)  # (a caller's pool may hold rows past the codes': SGLang's trash row)
            if t.dim() != 3 or t.shape[0] < nb or tuple(t.shape[1:]) != want or t.dtype != dt:
                raise ValueError(f"{name}: expected [{nb}, {want[0]}, {want[1]}] {dt} (block_norms={self.block_norms}, "
                                 f"per_token_witness={self.per_token_witness}), got {list(t.shape)} {t.dtype}")
        if not (self.v_norm.is_contiguous() and self.k_norm.is_contiguous()):
            # the kernels address a token's entry as blk·s_nb + h·s_nh + off (unit token stride, no overlap)
            raise ValueError(f"v_norm, k_norm: the kernels need contiguous tensors, got strides {self.v_norm.stride()} "
                             f"and {self.k_norm.stride()}")
        if self.v_norm.shape != self.k_norm.shape:  # (one stride pair for both)
            raise ValueError(f"v_norm, k_norm: one shape for both, got {list(self.v_norm.shape)} and "
                             f"{list(self.k_norm.shape)}")
        if self.v_norm.data_ptr() == self.k_norm.data_ptr():
            raise ValueError("v_norm, k_norm: one tensor for both: a write of ν would overwrite κ")

    def groups(self):
        return [torch.nonzero(self.group_id.cpu() == g).flatten().numpy() for g in range(self.num_groups)]
