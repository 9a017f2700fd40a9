"""Paged KV layout shared by every kernel (SPEC §1, §8), and memory accounting.

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
    v_norm            [NB, Hkv, TW]     ν ≥ ‖v̂_j‖ (int8_dither: ≥ s(‖c‖ + ‖u‖), the magnitudes the
                                        decode's split dot products add up)
    k_norm            [NB, Hkv, TW]     κ ≥ ‖k̂_j‖ (int8_dither: ≥ s(‖c‖ + ‖u‖)): the decode's
                                        logit-rounding radius Ξ is σ‖q_h‖·max κ·γ (SPEC §7)
    exact_k, exact_v  [NB, Hkv, T, D]   the exact backing store (model dtype); the serving path
                                        never writes it after the token's write
    block_table       [B, max_blocks]   int32 physical block ids per sequence
    seq_lens          [B]               int32

Repaired pages (gated caches, SPEC §6): ``RepairOverlay`` — ``slot`` [NB, Hkv] int32 (−1: not
repaired) into a pool of exact pages ``k``, ``v`` [R + 1, T, D] (model dtype) with ``k_norm``,
``v_norm`` [R + 1, T] float32 ≥ the exact norms (rounded up); the decode serves a repaired token
from the pool (``decode(..., repair=overlay)``), the codes of its page stay as written.

Per-token witnesses are stored in float16 rounded up; per-block witnesses in float32 (updated
with an atomic running max, so a block can be filled over several writes).

Floating point of the kernels (SPEC §7), the constants below:

* every witness / norm is computed scaled by its largest entry (no squaring underflow), inflated
  by ``KERNEL_REL_SLACK``, floored at ``KERNEL_WITNESS_FLOOR`` for lossy schemes (a residual whose
  entries a flush-to-zero GPU treats as 0 is < √D·2^-126) and rounded **up** into its dtype;
* a served logit σ·s_j·⟨q, c_j⟩ computed in fp32 (tensor cores: exact products, fp32 sums that
  may truncate) is within ``σ ‖q‖ κ_j γ`` of the exact one, γ = ``dot_gamma(D)``;
* a p̂ mass accumulated in fp32 (tf32x3 / ieee histogram dot, the running rescale by α per
  tile) is within a relative ``mass_eta(tiles)`` of the exact one; masses below
  ``FP32_FLUSH`` relative to the running maximum may be lost entirely (counted, ``ρ``).
"""

from __future__ import annotations

import dataclasses

import torch

from contract.bands import group_slices
from contract.schemes import INT4_GROUP, KERNEL_SCHEME_IDS, SCHEMES, scale_bytes_per_token

#: scheme ids shared by the kernels (constexpr SCHEME), from the scheme table (re-exported)
SCHEME_IDS = dict(KERNEL_SCHEME_IDS)
#: the storage dtype of each kernel scheme's codes ("none" stores the model dtype)
CODE_DTYPES = {name: getattr(torch, SCHEMES[name].code_dtype) for name in SCHEME_IDS if SCHEMES[name].code_dtype}
#: relative inflation of every fp32 witness / radius computed in a kernel (covers fp32
#: rounding of the residual, the sum of squares over ≤ 256 channels and the sqrt, and of the
#: dequantized value s·(c − u)); then rounded up into the storage dtype.
KERNEL_REL_SLACK = 2.0**-12
SUPPORTED_HEAD_DIMS = (64, 128, 256)
#: absolute floor added to every key / value witness of a lossy scheme (see the module doc)
KERNEL_WITNESS_FLOOR = 2.0**-100
#: unit roundoff assumed for an fp32 sum on tensor cores (2^-24 with round-to-nearest; 2^-23
#: covers truncating accumulation)
KERNEL_UNIT = 2.0**-23
#: below this (relative to the running maximum) an fp32 mass may be lost or imprecise: flushed
#: to 0 under 2^-126 (ftz), or its tf32x3 low part flushed; the epilogue's ρ counts it as lost
FP32_FLUSH = 2.0**-100
#: relative error of the fp32 exp of a logit difference (ex2.approx, the log2(e) product)
KERNEL_EXP_REL = 2.0**-20


def dot_gamma(head_dim: int, split3: bool = False) -> float:
    """γ with |fl(σ s ⟨q, c⟩) − σ s ⟨q, c⟩| ≤ γ σ ‖q‖ κ: D exact products summed in fp32, each
    add with relative error ≤ KERNEL_UNIT (truncation included), + the scale products and the
    subtraction of the running max (+32); ``split3``: the int4 tf32x3 dot (three partial products
    per term, each operand split into two tf32 parts: 3·2^-22 relative per product)."""
    if split3:
        return (3 * head_dim + 32) * KERNEL_UNIT + 2.0**-19
    return (head_dim + 32) * KERNEL_UNIT


def sketch_gamma(scheme: str, head_dim: int, bits: int) -> float:
    """γ with |fl(⟨q, r̃⟩) − ⟨q, r̃⟩| ≤ γ Σ|q_i||r̃_i| for the decode's key-sketch dot (``contract.sketch``);
    the write path adds γ‖r̃/a‖ to the witness (Σ|q_i||r̃_i| ≤ ‖a⊙q‖‖r̃/a‖).

    * β per token (int8, int8_dither): the decode dots the codes against q and scales by β after. On the GPU
      with a bf16 q the codes enter as bf16 16 + c (the magic-number conversion) and ⟨q, 2c + 1 − L⟩ =
      2·fl⟨q, 16 + c⟩ − (31 + L)·fl(Σq): the two fp32 dots err by ≤ γ_D Σ|q_i|(15 + L) and γ_D Σ|q_i|, the
      three combining roundings by ≤ 2^-23 (2(15 + L) + 2(31 + L)) Σ|q_i| (relative, fp32, magnitudes ≤
      (2(15 + L) + (31 + L)) Σ|q|): in all ≤ (61 + 3L)(γ_D + 2^-22) Σ|q_i|, and Σ|q_i| β/L ≤ Σ|q_i||r̃_i|
      (every level is an odd multiple of β/L). The interpreter's fp32 dot of the levels errs by less.
    * β per channel (fp8, int4_group, kivi2): β·level in fp32 operands (tf32x3): ``dot_gamma(D, split3=True)``."""
    per_token_beta = SCHEMES[scheme].residual_range == "half-scale" and SCHEMES[scheme].key_scales == "token"
    if per_token_beta:
        L = 1 << bits
        return (61 + 3 * L) * (dot_gamma(head_dim) + 2.0**-22)
    return dot_gamma(head_dim, split3=True)


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


#: relative error of the p̂ operand split of the histogram dot: tf32x3 (the dropped lo·lo product
#: and the tf32 rounding of the lo parts; also used for the interpreter's ieee dot) and bf16x2
#: (p̂ = p_hi + p_lo in bf16, each rounded to nearest: |p̂ − p_hi − p_lo| ≤ 2^-8 · 2^-8 p̂); "page":
#: page-level bins, masses summed in fp32 (≤ tile_tokens + 16 adds, already counted), no split
HIST_SPLIT_REL = {"tf32x3": 2.0**-19, "bf16x2": 2.0**-16, "page": 0.0}
#: the packed form's own roundings (``decode``'s PACK_HIST: hi and lo accumulated in separate columns,
#: after the loop the lo column rescaled to the hi column's maximum and added: two fp32 roundings)
HIST_PACK_REL = 2 * KERNEL_UNIT
#: growth of the accumulated terms over the mass: the fp32 sums' rounding bounds are relative to the
#: sum of the terms' magnitudes, and a split operand's parts are summed with their signs
#: (Σ|p_hi| + Σ|p_lo| ≤ (1 + 2^-8 + 2^-16) Σ p̂ for bf16 parts rounded to nearest, ≤ (1 + 2^-10 + …) Σ p̂
#: for tf32's; rounded up here to 2^-7 and 2^-9); page masses are sums of p̂ itself
HIST_TERM_GROWTH = {"tf32x3": 2.0**-9, "bf16x2": 2.0**-7, "page": 0.0}
#: products per token that one accumulator sums in the histogram dot: tf32x3 chains three dots (hi·hi,
#: hi·lo, lo·hi) into one accumulator, the two-dot bf16x2 form two (hi, then lo); the packed bf16x2 form
#: (``decode``'s PACK_HIST) one per column, page masses one
HIST_CHAINED_TERMS = {"tf32x3": 3, "bf16x2": 2, "page": 1}


def mass_eta_terms(tile_tokens: int, split: str = "tf32x3", packed: bool = False) -> tuple[float, float]:
    """(a, b) with ``mass_eta(tiles, tile_tokens, split) = a + tiles · b``: the fp32 accumulation of
    ``HIST_CHAINED_TERMS[split]`` (1 when ``packed``) products per token, grown by
    ``HIST_TERM_GROWTH[split]``, plus the operand split ``HIST_SPLIT_REL[split]`` (and, ``packed``,
    ``HIST_PACK_REL``)."""
    g = 1.0 + HIST_TERM_GROWTH[split]
    terms = 1 if packed else HIST_CHAINED_TERMS[split]
    a = g * ((terms * tile_tokens + 16) * KERNEL_UNIT + 2 * (KERNEL_EXP_REL + KERNEL_UNIT)) + HIST_SPLIT_REL[split]
    if packed:
        a += HIST_PACK_REL
    return a, g * (KERNEL_EXP_REL + KERNEL_UNIT)


def mass_eta(tiles, tile_tokens: int, split: str = "tf32x3", packed: bool = False):
    """Relative error of a p̂ mass accumulated by the decode kernel over ``tiles`` tiles of
    ``tile_tokens`` tokens: the histogram dot of one tile (≤ chained terms · tile_tokens + 16 fp32
    sums, ``HIST_CHAINED_TERMS``, and the operand split ``HIST_SPLIT_REL[split]``), the running
    rescale by α = exp(m − m') (``KERNEL_EXP_REL`` per tile) and the fp32 add per tile, every
    accumulation term grown by ``HIST_TERM_GROWTH[split]``."""
    a, b = mass_eta_terms(tile_tokens, split, packed)
    return a + tiles * b


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
    ) -> "PagedKV":
        from contract.sketch import check_bits

        sketch_bits = check_bits(sketch_bits)
        if scheme not in SCHEME_IDS:
            raise ValueError(f"scheme: the kernels support {sorted(SCHEME_IDS)}, got {scheme!r}")
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim: the kernels support {SUPPORTED_HEAD_DIMS}, got {head_dim}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size: must be a power of two, got {block_size}")
        groups = group_slices(head_dim, num_groups, rotary_dim, layout)
        gid = torch.empty(head_dim, dtype=torch.int32)
        for g, idx in enumerate(groups):
            gid[torch.from_numpy(idx)] = g
        row = SCHEMES[scheme]
        cdt = CODE_DTYPES.get(scheme, model_dtype)
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        cshape = shape[:3] + (head_dim // row.codes_per_byte,)  # int4_group: two codes per byte, kivi2 four

        def scale_shape(kind):  # the scale (and zero) layout of one role, from the table's scale kind
            if kind == "group":  # one scale / zero per INT4_GROUP channels of a token
                return shape[:3] + (head_dim // INT4_GROUP,)
            if kind == "channel-block":  # kivi2 keys: one per channel of a page (= a block of T tokens)
                return (num_blocks, num_kv_heads, head_dim)
            return shape[:3]

        ksshape, vsshape = scale_shape(row.key_scales), scale_shape(row.value_scales)
        asym = ("group", "channel-block")  # asymmetric schemes store a zero beside each scale
        tw = block_size if per_token_witness else 1
        wdt = torch.float16 if per_token_witness else torch.float32
        kw = dict(device=device)
        if weights is None:
            weights = torch.ones(num_kv_heads, head_dim)
        weights = torch.as_tensor(weights, dtype=torch.float32).to(device).contiguous()
        if tuple(weights.shape) != (num_kv_heads, head_dim):
            raise ValueError(f"weights: expected [{num_kv_heads}, {head_dim}] channel weights, got {tuple(weights.shape)}")
        if not bool(torch.all(torch.isfinite(weights) & (weights > 0))):
            raise ValueError("weights: every channel weight must be positive and finite")
        mant, _ = torch.frexp(weights)
        if not bool(torch.all(mant == 0.5)):
            raise ValueError("weights: every channel weight must be a power of two (exact products and quotients)")
        has_weights = bool((weights != 1).any())
        if (sketch_bits or has_weights) and (num_groups != 1 or not per_token_witness):
            raise ValueError("sketch_bits / weights: the sketch radius takes one per-token witness (num_groups=1, "
                             "per_token_witness=True)")
        if sketch_bits and scheme == "none":
            sketch_bits = 0  # an exact cache has no residual to sketch
        ksk = (torch.zeros(num_blocks, num_kv_heads, block_size, head_dim * sketch_bits // 8, dtype=torch.uint8, **kw)
               if sketch_bits else torch.zeros(1, dtype=torch.uint8, **kw))
        return PagedKV(
            scheme=scheme,
            block_size=block_size,
            num_groups=num_groups,
            per_token_witness=per_token_witness,
            group_id=gid.to(device),
            k_codes=torch.zeros(cshape, dtype=cdt, **kw),
            v_codes=torch.zeros(cshape, dtype=cdt, **kw),
            k_scale=torch.ones(ksshape, dtype=torch.float16, **kw),
            v_scale=torch.ones(vsshape, dtype=torch.float16, **kw),
            k_zero=torch.zeros(ksshape if row.key_scales in asym else (1,), dtype=torch.float16, **kw),
            v_zero=torch.zeros(vsshape if row.value_scales in asym else (1,), dtype=torch.float16, **kw),
            k_wit=torch.zeros(num_blocks, num_kv_heads, tw, num_groups, dtype=wdt, **kw),
            v_wit=torch.zeros(num_blocks, num_kv_heads, tw, dtype=wdt, **kw),
            v_norm=torch.zeros(num_blocks, num_kv_heads, tw, dtype=wdt, **kw),
            k_norm=torch.zeros(num_blocks, num_kv_heads, tw, dtype=wdt, **kw),
            # with_exact=False (benchmarks only): a 1-element placeholder, never read by decode
            exact_k=torch.zeros(shape if with_exact else (1,), dtype=model_dtype, **kw),
            exact_v=torch.zeros(shape if with_exact else (1,), dtype=model_dtype, **kw),
            seed=seed,
            layer=layer,
            sketch_bits=sketch_bits,
            k_sketch=ksk,
            weights=weights,
            has_weights=has_weights,
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

    def groups(self):
        return [torch.nonzero(self.group_id.cpu() == g).flatten().numpy() for g in range(self.num_groups)]


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

    def bind(self, cache: PagedKV) -> "RepairOverlay":
        """Record which cache this overlay serves (checked by ``validate``); returns self. Call it
        again after the cache is regrouped / reordered (new storage)."""
        self.owner = cache.k_codes.untyped_storage().data_ptr()
        return self

    def validate(self, cache: PagedKV, check_slots: bool = False) -> None:
        """ValueError unless this overlay fits ``cache`` (bound to it, shapes, dtypes, devices);
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
        from contract.rounding import round_up_f32

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


@dataclasses.dataclass
class ExactWindow:
    """The exact window of a batch (``contract.sketch``): each sequence's first ``sink`` and last
    ``recent`` tokens, kept in the model's dtype on the device and served by the decode with radius 0,
    φ = 0 (SPEC §2 as amended by issue 33). A ring per (sequence, kv head):

        k, v            [B, Hkv, sink + recent + 1, D]  model dtype: column j < sink holds token j,
                                                        column sink + (j mod recent) token j of the recent
                                                        window; the last column is a scratch row that
                                                        other tokens' writes land in (never read)
        k_norm, v_norm  [B, Hkv, sink + recent + 1]     float32 ≥ ‖k_j‖ / ‖v_j‖ (κ, ν of the served tokens),
                                                        rounded up; NaN until written

    The decode serves token j of a sequence of length n from the ring when j < sink or j ≥ n − recent
    (one predicate per token lane, no host work); ``write`` puts new tokens there (device index ops: a
    CUDA graph can capture it). A token written while it is in the recent window stays in its column
    until the token ``recent`` positions later overwrites it, by which time it has left the window."""

    sink: int
    recent: int
    k: torch.Tensor
    v: torch.Tensor
    k_norm: torch.Tensor
    v_norm: torch.Tensor

    @property
    def columns(self) -> int:
        return self.sink + self.recent

    @staticmethod
    def allocate(batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, sink: int, recent: int,
                 device="cpu") -> "ExactWindow":
        from contract.sketch import check_window

        sink, recent = check_window((sink, recent))
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"ExactWindow: the exact values are bf16 / fp16 / fp32, got {dtype}")
        c = sink + recent + 1
        kw = dict(device=device)
        return ExactWindow(sink, recent,
                           k=torch.zeros(batch, num_kv_heads, c, head_dim, dtype=dtype, **kw),
                           v=torch.zeros(batch, num_kv_heads, c, head_dim, dtype=dtype, **kw),
                           k_norm=torch.full((batch, num_kv_heads, c), float("nan"), dtype=torch.float32, **kw),
                           v_norm=torch.full((batch, num_kv_heads, c), float("nan"), dtype=torch.float32, **kw))

    def columns_of(self, positions: torch.Tensor, n_end) -> torch.Tensor:
        """The ring column [N] int64 of tokens at ``positions`` [N] of sequences whose length after this
        write is ``n_end`` (an int or [N]); the scratch column for a token in neither part."""
        pos = positions.to(torch.int64)
        scratch = torch.full_like(pos, self.columns)
        col = scratch
        if self.recent:
            col = torch.where(pos >= torch.as_tensor(n_end, device=pos.device) - self.recent,
                              self.sink + pos % self.recent, scratch)
        return torch.where(pos < self.sink, pos, col)

    def write(self, seq: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_end) -> None:
        """Tokens (``seq`` [N], ``positions`` [N]) with exact ``k``, ``v`` [N, Hkv, D] (the ring's dtype)
        into their ring columns (device gathers and scatters, no host sync)."""
        if k.dtype != self.k.dtype or v.dtype != self.v.dtype:
            raise ValueError(f"ExactWindow.write: exact values of the ring's dtype {self.k.dtype} only, got {k.dtype}")
        if k.shape[0] == 0 or self.columns == 0:
            return
        dev = self.k.device
        col = self.columns_of(positions.to(dev), n_end if isinstance(n_end, int) else n_end.to(dev))
        b = seq.to(dev, torch.int64)
        H = self.k.shape[1]
        bb = b[:, None].expand(-1, H)
        hh = torch.arange(H, device=dev)[None, :].expand_as(bb)
        cc = col[:, None].expand_as(bb)
        kd, vd = k.to(dev), v.to(dev)
        self.k[bb, hh, cc] = kd
        self.v[bb, hh, cc] = vd
        self.k_norm[bb, hh, cc] = RepairOverlay.norms_up(kd)
        self.v_norm[bb, hh, cc] = RepairOverlay.norms_up(vd)

    def fill(self, k: torch.Tensor, v: torch.Tensor, n: int) -> None:
        """Refill every sequence's window from its exact tokens ``k``, ``v`` [B, Hkv, n, D] (a crop: the
        recent window moved back to tokens the ring no longer holds)."""
        B = k.shape[0]
        pos = torch.arange(n, device=self.k.device)
        keep = (pos < self.sink) | (pos >= n - self.recent)
        idx = pos[keep]
        if idx.numel() == 0:
            return
        seq = torch.arange(B, device=self.k.device).repeat_interleave(idx.numel())
        p = idx.repeat(B)
        kk = k.to(self.k.device)[:, :, idx].permute(0, 2, 1, 3).reshape(B * idx.numel(), k.shape[1], k.shape[3])
        vv = v.to(self.k.device)[:, :, idx].permute(0, 2, 1, 3).reshape(B * idx.numel(), v.shape[1], v.shape[3])
        self.write(seq, p, kk.to(self.k.dtype), vv.to(self.v.dtype), n)

    def select(self, index: torch.Tensor) -> "ExactWindow":
        """The rings of sequences ``index`` (copies: beam search reorders, a gate re-decodes some rows)."""
        index = index.to(self.k.device)
        return dataclasses.replace(self, k=self.k.index_select(0, index), v=self.v.index_select(0, index),
                                   k_norm=self.k_norm.index_select(0, index), v_norm=self.v_norm.index_select(0, index))

    def validate(self, cache: "PagedKV", batch: int) -> None:
        """ValueError unless the rings fit ``cache`` and a batch of ``batch`` sequences."""
        H, D = cache.num_kv_heads, cache.head_dim
        c = self.columns + 1
        for name in ("k", "v"):
            t = getattr(self, name)
            if t.shape != (batch, H, c, D) or not t.is_contiguous():
                raise ValueError(f"window.{name}: expected a contiguous [{batch}, {H}, {c}, {D}] tensor, got "
                                 f"{tuple(t.shape)}")
            if t.device != cache.k_codes.device:
                raise ValueError(f"window.{name}: on {t.device}, the cache is on {cache.k_codes.device}")
        for name in ("k_norm", "v_norm"):
            t = getattr(self, name)
            if t.shape != (batch, H, c) or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"window.{name}: expected a contiguous float32 [{batch}, {H}, {c}] tensor")
        if cache.scheme != "none" and self.k.dtype != cache.exact_k.dtype and cache.exact_k.numel() > 1:
            raise ValueError(f"window.k: the ring must hold the cache's model dtype {cache.exact_k.dtype}, got {self.k.dtype}")


def bytes_per_token(
    scheme: str,
    head_dim: int = 128,
    num_groups: int = 4,
    per_token_witness: bool = True,
    block_size: int = 16,
    witness_bytes: int = 2,
    scale_bytes: int = 2,
    model_bytes: int = 2,
    sketch_bits: int = 0,
    window=None,
    context: int = 4096,
) -> dict:
    """Bytes per token and kv head of the served cache (K + V), including scales and witnesses.

    ``witness_bytes``: 2 (float16, the kernels' per-token layout) or 1 (fp8 e4m3 rounded up);
    per-block witnesses are counted as float32 shared by ``block_size`` tokens. ``sketch_bits``: the
    key residual sketch (``contract.sketch``: D·b/8 bytes + a float16 range per token). ``window``
    (sink, recent): the exact window's model-dtype K / V (+ two float32 norms) per sequence, amortised
    over ``context`` tokens. The exact backing store lives in host memory and is not counted. Returns
    the breakdown and the ratio of tokens that fit at equal memory versus an unquantized
    ``model_bytes`` cache.
    """
    from contract.sketch import check_bits, check_window, sketch_bytes_per_token

    row = SCHEMES.get(scheme)
    if row is None:
        raise ValueError(f"scheme: unknown {scheme!r}")
    sketch_bits = check_bits(sketch_bits)
    sink, recent = check_window(window)
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context: expected a positive int, got {context!r}")
    if row.code_bits is None:  # "none": the model's dtype
        code_bytes = model_bytes
    else:  # what the kernels store: codes_per_byte codes in a byte (int4_group 2, kivi2 1)
        code_bytes = 1 if row.codes_per_byte == 1 else 1 / row.codes_per_byte
    codes = 2 * head_dim * code_bytes
    # K and V: one fp16 scale per token ("token"); fp16 scale + zero per 32 channels ("group");
    # kivi2 keys: fp16 scale + zero per channel per block, shared by block_size tokens
    scales = (scale_bytes_per_token(row.key_scales, head_dim, block_size, scale_bytes)
              + scale_bytes_per_token(row.value_scales, head_dim, block_size, scale_bytes))
    if per_token_witness:
        wit = (num_groups + 3) * witness_bytes  # G key witnesses + φ + ν + κ
    else:
        wit = (num_groups + 3) * 4 / block_size
    sketch = sketch_bytes_per_token(sketch_bits, head_dim) if row.lossy else 0.0
    if not row.lossy:
        wit = 0
    win = (sink + recent) * (2 * head_dim * model_bytes + 8) / context if row.lossy else 0.0
    total = codes + scales + wit + sketch + win
    base = 2 * head_dim * model_bytes
    return {"codes": codes, "scales": scales, "witnesses": wit, "sketch": sketch, "window": win, "total": total,
            "ratio_vs_model_dtype": base / total}
