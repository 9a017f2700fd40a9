"""Decode as plan + run: everything a decode launch fixes from the shape before it runs.

    plan = plan_decode(cache, batch, q_heads, q_dtype, device, capacity, meter=True, ...)
    out = kernels.decode.decode(cache, q, block_table, seq_lens, plan=plan)   # the run

``DecodePlan`` holds the split count (``choose_splits``: the one split heuristic of the library), the
loop tile (``Tile``, ``tile_config``: measured on the H200, bench/RESULTS.md), and what the launch derives
from them and from the cache / query / overlays: pages per tile, warps, stages, the register cap, the
head columns, the histogram's operand split and packing, the prefetches, and the kernel variant's
switches (tensor-core operands, fp32 PV, sketch, weights, Tier B). ``decode`` plans itself when given no
plan (the same plan as ``plan_decode`` with its arguments); a caller that plans once (the cache's kernel
path, the SGLang gate's re-decode) passes the plan or its split count and tile. A benchmark forces a
configuration by planning with its own ``Tile`` (``plan_decode(tile=...)``) or by ``dataclasses.replace``
on the plan; ``decode`` checks a given plan against its launch (a plan for another kernel variant is
refused: the meter's constants must be those of the kernel that ran). ``merge_warps`` is the fused merge's launch
rule (its warps per row program).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import triton

from contract.schemes import SCHEMES

from .exact_window import ExactWindow
from .interpret import INTERPRET
from .key_levels import KEY_LEVELS
from .paged import SCHEME_IDS, PagedKV
from .repair import RepairOverlay

log = logging.getLogger("witcert.kernels")
_LOGGED: dict = {}

#: transposed loads, one stage; run J timed int8, the others share its loop but were not timed)
EIGHT_BIT_SCHEMES = tuple(name for name in SCHEME_IDS if SCHEMES[name].code_bits == 8)
#: 64-token unmetered tiles and their register cap apply from this many programs per SM
MANY_PROGRAMS_PER_SM = 4
#: register caps per thread for the 8-bit kernels. Metered (128-token tiles, every grid): three programs
#: per SM instead of two; with 8 head columns and the packed histogram no spill (sm_90 SASS), 0.77-0.82×
#: the uncapped time at B ≥ 8 (run K, bench/tile_ab.py); at B 1 the same time on run K's 33 splits and,
#: with ``choose_splits`` filling one wave of three programs per SM (49 splits; since run R long B 1 sequences
#: take the one-warp tile instead), 0.88× at 32K, 0.77× at 128K (run L). Unmetered (64-token tiles, on grids of ≥
#: MANY_PROGRAMS_PER_SM programs per SM): six
#: programs per SM instead of four (24 B of spill), 0.84-0.97× the
#: uncapped time at B ≥ 8 (runs K3, K4; 64 registers: better at B 8, worse at B 32). ``test_register_
#: cap_changes_no_value`` checks capped = uncapped bit for bit: passed on the H200 for both caps
#: (bench/results/2026-12-02/cap_test_2026-12-02_K.log, bench/results/2026-12-02/cuda_subset_2026-12-02_K4.log).
#: ``CAP_REGISTERS`` False turns
#: both off (a benchmark forces a cap for one call with its own ``Tile`` or a replaced ``DecodePlan.max_registers``)
METERED_REGISTER_CAP = 168
UNMETERED_REGISTER_CAP = 80
#: the cap of a capped metered tile that reads the key sketch or the channel weights (its codes, its chunked dot
#: and the weighted head factor): no spill at 232 (58 B of spill under ``METERED_REGISTER_CAP``), 0.85-1.0x
#: the 168-register time at every shape of bench/sketch_speed.py (run S2, bench/TIGHTNESS.md), on the grid
#: ``choose_splits`` sized for the 168-register tile
SKETCH_REGISTER_CAP = 232
CAP_REGISTERS = True
#: the centred sketch box's two excess sums (``decode_meter._excess_tile``) accumulated beside the histogram wherever
#: the sketch radius is metered (a sketch or channel weights): a further closed form of tier A's TV⁺ in the merge
#: (``merge_terms._excess_form``; bench/TIGHTNESS.md, "The centred box unbinned, in one pass"). Read by
#: ``launch_variant`` at call time: a benchmark turns it off for the call without them (bench/sketch_speed.py)
EXCESS_FORM = True
#: with the excess sums, the same boxes' small (t, λ) grid (``excess_grid``: 13 more sums per (token, head) in a 16-column block, the
#: contract's ``GRID_TILT_POINTS`` / ``GRID_TILT_LAMBDAS``), a tighter closed form in the merge (bench/TIGHTNESS.md,
#: "A small grid in the fused merge"). Read by ``launch_variant`` at call time, as EXCESS_FORM. Measured on an H100
#: (bench/TIGHTNESS.md, "The grid on a GPU"): int8 median TV⁺/TV 4.43 → 3.88 for 1.21-1.26× the metered call
EXCESS_GRID = True
#: the grid's 13 sums of a tile in one multi-operand reduction (``excess_grid._grid_tile(ONE=True)``, ``tl.reduce``)
#: instead of 13 ``tl.sum``: the same terms; the sm_90 code of the default int8 tile (4 warps, 128 tokens) has 92
#: ``BAR.SYNC`` per tile loop against 128 (2026-12-07, offline, Triton 3.7.1; no other change in its instruction
#: count). Run J3 (2026-12-07, an H100, bench/results/2026-12-07j/J3_run.sh, bench/tilt_batch_probe.py, 32 graphed
#: layers): the default int8 call (deferred forms) 0.92-0.94× the time at B 1 (4K / 32K), 1.00× at B 8 (the fused tilt
#: 0.93-0.96× and 0.98-1.00×); outputs and record bit for bit (tests/kernels/test_grid_one_reduce.py on that GPU).
#: GPU launches only (``grid_one_reduce``): the interpreter folds a multi-operand reduction sequentially, in another
#: order than its ``tl.sum``
GRID_ONE_REDUCE = True
#: the register file, the most resident threads and the most resident programs (thread blocks) of a
#: multiprocessor (sm_80 / sm_89 / sm_90)
SM_REGISTERS = 65536
SM_THREADS = 2048
SM_PROGRAMS = 32
#: the schemes whose metered kernel takes one-warp programs of 32 tokens on grids of ≥ MANY_PROGRAMS_PER_SM
#: programs per SM (run P, 2026-12-03, bench/results/2026-12-03/tile_ab_waves_2026-12-03_P.log, kernel + merge: 0.90× the
#: 128-token / 4-warp time at B 8 / 32K, 0.91× at B 8 / 128K, 0.92× at B 32 / 32K (12 splits); 1.5× slower at B 1
#: at ≤ 64 splits, where the grid is small: run R's ``choose_splits`` gives long B 1-4 sequences a wave of them). A one-warp
#: program exchanges nothing between warps per tile (the 4-warp
#: tile's p̂, one-hot and row maxima pass through shared memory behind 24 barriers per tile, sm_90 SASS);
#: under METERED_REGISTER_CAP twelve fit per SM (spills: Triton's n_spills 28 on the H200, 140 B of spill stores in
#: offline sm_90 ptxas, bench/sass_probe.py). Only int8 was timed: the other 8-bit
#: schemes keep the 4-warp tile
ONE_WARP_METERED_SCHEMES = ("int8",)
#: fp8 schemes whose meter-off key dot runs in fp16 under a bf16 query on the GPU (the decode's KEY_F16,
#: ``decode_program._key_f16_query``): e4m3 codes convert to fp16 in one packed instruction per two, where the bf16 dot
#: took a second, unpacked fp16 → bf16 conversion per code (sm_90 SASS, Triton 3.6.0: 128 of a 128-token tile's 256
#: F2F per thread, bench/sass_probe.py). Outputs bit-identical. Run F1 (2026-12-07, an H100, bench/key_dot_ab.py,
#: bench/RESULTS.md): meter-off e4m3 0.92-0.99× the time (SGLang's layout 0.87-0.94×); e5m2 (whose codes reach bf16
#: through fp32) 0.94-1.02×; metered e4m3 0.98-1.02×, e5m2 1.02-1.07×: metered calls keep the bf16 dot
#: (KEY_F16_METERED, the guard's tests turn it on), and e5m2 does everywhere. A repaired page's exact keys (bf16, not
#: exact in fp16) keep the bf16 dot
KEY_F16_SCHEMES = ("fp8_e4m3", "fp8_e4m3_scaled")
KEY_F16_METERED = False
#: L2 eviction hints of the decode pass ("": none). ``KV_EVICT``: the 8-bit code tiles' loads ("evict_first", the
#: default: the KV is read once a step, so its lines go first); ``PARTIALS_EVICT``: the split partials' stores
#: ("evict_last": the merge reads them after the rest of the pass has streamed its KV through the L2; none by default).
#: Hints only: no value changes (sm_90: ``createpolicy.fractional.L2::…`` with ``L2::cache_hint``). Run J2 (2026-12-07,
#: an H100, bench/results/2026-12-07j/J2_run.sh, bench/RESULTS.md): the paged int8 call (Hq 32, 32K) metered/off
#: 1.42 → 1.16× at B 8, 1.38 → 1.38× at B 1; SGLang's fp8 call × SGLang's graph 1.16 → 1.11 (B 8 / 4K), 1.18 → 1.14
#: (B 8 / 32K), B 1 0.89 → 0.92 and 0.47 → 0.45. Run K2 (bench/decode.py, B 1 / 8 / 32 × 32K / 128K): the full-meter
#: call 0.76-0.85× its time at B ≥ 8 and at B 1 / 128K (× off 1.48-1.51 → 1.10-1.33), meter off 0.97-1.04×. Runs I1-I3
#: had B 1 / 4K 1.16 → 1.24 in a benchmark replaying one layer (whose KV the L2 keeps between replays, unlike a model's
#: layers); partials evict_last nothing more
KV_EVICT = "evict_first"
PARTIALS_EVICT = ""
EVICTION_POLICIES = ("", "evict_first", "evict_last", "evict_normal")


def grid_one_reduce(device) -> bool:
    """The decode pass's ``GRID_ONE`` constexpr: ``GRID_ONE_REDUCE`` on a CUDA launch, False elsewhere (the
    interpreter), checked."""
    if not isinstance(GRID_ONE_REDUCE, bool):
        raise ValueError(f"kernels.plan.GRID_ONE_REDUCE = {GRID_ONE_REDUCE!r}: True or False")
    return GRID_ONE_REDUCE and torch.device(device).type == "cuda"


def eviction_hints() -> dict:
    """The decode pass's L2 eviction hints as its constexprs (``KV_EVICT`` / ``PARTIALS_EVICT``), checked: a policy
    Triton does not know would fail at compile time with a message that does not name the setting."""
    hints = dict(KV_EVICT=KV_EVICT, PARTIALS_EVICT=PARTIALS_EVICT)
    for name, v in hints.items():
        if v not in EVICTION_POLICIES:
            raise ValueError(f"kernels.plan.{name} = {v!r}: one of {EVICTION_POLICIES}")
    return hints

#: the one-warp metered tile prefetches the next tile into the L2 (``Tile.prefetch``; run Q, 2026-12-03,
#: bench/results/2026-12-03/tile_ab_prefetch_2026-12-03_Q.log, kernel + merge: 0.955-0.981× the time at B 8 and 32, outputs
#: bit-identical; into the L1 no better). ncu (run Q) had put 48 % of its stall samples on long-scoreboard waits
#: for the tile's code and scale loads, at 2.8 active warps per scheduler. The unmetered 64-token tile spilled
#: under its cap with it (1.2× slower; uncapped, at 96 registers or in one-warp programs 7-35 % slower than the
#: capped default), and the B 1 4-warp metered tile was 5 % slower: neither prefetches
METERED_ONE_WARP_PREFETCH = 1
#: the fewest tokens per split ``choose_splits`` gives a small grid that it puts on one wave of the many-program
#: tile (run R, 2026-12-03, bench/b1_probe.py, Hq 32, whole call, ms; bench/results/2026-12-03/b1_probe_2026-12-03_R.log and _R2 / _R3):
#: metered B 1, one-warp tile: at 32K 128 splits (256 tokens a split) 0.0595 against 0.0647 for the 4-warp tile at
#: 49 and 0.0635 at 192 splits; at 128K 198 splits 0.146 (192), 128 splits 0.153, 4-warp 0.157; B 2 / 4: 3-12 %
#: less time. Unmetered, the capped 64-token tile against the 128-token / 8-warp one: B 1 32K 0.0442 / 0.0483,
#: 128K 0.113 / 0.139; B 2 0.068 / 0.116, 0.209 / 0.418; B 4 8K 0.043 / 0.050, 32K 0.116 / 0.142
SMALL_GRID_MIN_SPLIT_TOKENS = 256
#: the schemes whose small grids ``choose_splits`` puts on one wave of the many-program tile (only int8 was timed)
SMALL_GRID_SCHEMES = ("int8",)
#: metered splits of whole tiles (``choose_splits``, last): the fewest splits whose programs run as many tile
#: iterations as the count chosen before, so the programs' last tiles are as full as that allows (a split of 1.3
#: tiles takes two tiles' time; fewer programs also mean fewer partials for the merge). bench/RESULTS.md run Q7 (2026-12-07, an H100, int8
#: paged, the rule off → on): B 1 / 8K 49 → 32 splits 0.87× (group radius) / 0.77× (the default call), B 2 / 4K 24 → 16
#: 0.94 / 0.84, B 4 / 2K 12 → 8 0.90 / 0.82, B 8 / 1K 6 → 4 0.93 / 0.82, none slower; run Q6's first form (at least two
#: tiles a split) also took B 1 / 4K from 32 splits of one full tile to 16 and lost 14 %
METERED_WHOLE_TILES = True
#: the same cut for unmetered counts, the small grid's too (``bench/split_ab.py --unmetered``). Off: bench/RESULTS.md run
#: F3 (2026-12-07, an H100, int8 paged, the meter-off call): B 1 / 32K 99 → 86 splits 0.98×, B 1 / 8K 33 → 32 0.96×
#: but 1.11× with the exact window, B 1 / 128K 99 → 98 1.00×
UNMETERED_WHOLE_TILES = False
#: and at most this many splits (the merge reads the next power of two of partials per row: measured up to 256 at
#: d 128; a grid of one or two kv heads would otherwise take a thousand)
SMALL_GRID_MAX_SPLITS = 256
#: the most partial-output floats per row (the merge's next power of two of the split count times d) a small grid
#: is given: 256 × 128, the largest measured (run R, d 128); d 256 then takes at most 128 splits
SMALL_GRID_MAX_PARTIALS = 256 * 128
#: the smallest share of a wave that count must fill (run R, metered B 1: 0.65 of a wave (128 splits) was the best
#: measured at 32K; 0.48 (96 splits) no better than the 4-warp tile at 32K and 19 % slower at 128K)
SMALL_GRID_MIN_WAVE = 0.6
#: ``choose_splits`` sizes grids of fewer waves than this to whole waves (run L: 12 vs 16 splits at B 32,
#: 10 waves, measured no better; at 0.7-2.6 waves 3-22 % faster)
FEW_WAVES = 4
#: the 8-bit schemes the caps apply to: not the position-keyed (dithered) ones, whose in-kernel dither
#: generation spills 1.5 KB under the metered cap (sm_90 SASS, bench/sass_probe.py --scheme int8_dither)
CAPPED_SCHEMES = tuple(name for name in EIGHT_BIT_SCHEMES if not SCHEMES[name].position_keyed)


def packs_histogram(gq: int, head_columns: int) -> bool:
    """Whether the padding columns can carry the histogram's lo parts (PACK_HIST): GQ ≤ half the columns."""
    return 2 * gq <= head_columns


@dataclasses.dataclass(frozen=True)
class Tile:
    """A decode launch's loop configuration (``tile_config``)."""
    tokens: int  # tokens per tile (a multiple of the block size)
    stages: int  # software-pipeline stages
    warps: int
    max_registers: int | None = None  # per-thread register cap (Triton's ``maxnreg``), None: the compiler's
    # the fewest query-head columns a program's tiles are padded to (BLOCK_H ≥ GQ; the tensor-core dots take
    # 8 columns as mma.sync n8 where 16 went to wgmma: 2-10 % less time at GQ 4-8, run K)
    head_columns: int = 8
    # 1: the next tile's code rows, scales and witnesses are prefetched into the L2 while a tile computes
    # (prefetch.global.L2, block ids two tiles ahead; on the GPU); 0: none
    prefetch: int = 0

    def resident_programs(self) -> int | None:
        """Programs that fit on one multiprocessor under the register cap (None without a cap: the
        compiler's count is known only after the launch). Shared memory does not bind these tiles
        (the 8-bit one-stage ones; run L's split A/B timed the waves this predicts)."""
        if self.max_registers is None:
            return None
        regs = -(-self.max_registers // 8) * 8  # allocated per warp in units of 8 per thread
        return max(1, min(SM_REGISTERS // (regs * 32 * self.warps), SM_THREADS // (32 * self.warps), SM_PROGRAMS))


def tile_config(meter: bool, scheme: str = "int8", programs_per_sm: float = 0.0, levels: str = "token",
                block_size: int = 16) -> Tile:
    """The decode loop's tile on the H200 for a grid of ``programs_per_sm`` programs per
    multiprocessor (bench/tile_ab.py, bench/RESULTS.md runs J, K and L, 2026-12-02). The 8-bit code tiles are
    loaded in the other orientation and transposed before their cast, so Triton moves them into
    the dots' register layout with 16-byte shared-memory accesses (sm_90 SASS: no byte loads,
    15-18 % fewer instructions per tile, no spills); every 8-bit configuration takes one stage (with two,
    cp.async stages the transposed tiles without bytewise reads now, sm_90 SASS, but every two-stage tile
    was slower on the H200: run M, bench/tile_ab.py --pipe).

    * meter on, 8-bit codes: 128-token tiles, one stage, 4 warps (211 registers with 8 head
      columns and the packed histogram; capped at ``METERED_REGISTER_CAP``, no spill, three programs
      per SM, on every grid while ``CAP_REGISTERS``, for the ``CAPPED_SCHEMES``: not int8_dither);
      for the ``ONE_WARP_METERED_SCHEMES`` (int8) on grids of ≥ ``MANY_PROGRAMS_PER_SM`` programs per
      SM, 32-token tiles in one-warp programs under the same cap (twelve per SM; run P: 7-10 % faster
      at B 8 and 32, and ``choose_splits`` sizes their grid to whole waves of twelve), where a page
      (``block_size`` tokens) fits in such a tile, each prefetching its next tile into the L2
      (``METERED_ONE_WARP_PREFETCH``, run Q: 2-5 % faster);
    * meter off, 8-bit codes: 64-token tiles, one stage, 4 warps (116 registers; capped at
      ``UNMETERED_REGISTER_CAP`` for the ``CAPPED_SCHEMES``: six programs per SM) on grids of ≥
      ``MANY_PROGRAMS_PER_SM`` programs per SM, else 128-token tiles, one stage, 8 warps (fewer, longer
      programs: short sequences at small B; ``choose_splits`` gives int8's long small-B grids enough splits
      for the 64-token tile, run R);
    * the fp32-dequantizing schemes (int4_group, kivi2): 128-token tiles, one stage with the meter,
      else two; 4 warps; scheme none (SGLang's bf16 pool): two stages (Triton 3.6 emits an out-of-bounds
      __shared__ read for the metered none kernel at one stage, bench/crash_probe.py) and 8 head columns
      (2026-12-05, H100 runs Y1-Y3: the SGLang bf16 call 8-23 % faster metered and 7-20 % unmetered than at
      16 columns; compute-sanitizer memcheck clean on the paged and SGLang layouts, graph-replayed too).

    Every tile pads the GQ query heads of a kv head to ``head_columns`` (8; the dots run as mma.sync
    n8 instead of wgmma n16: 2-10 % less time, fewer registers, run K), except the metered page-level
    bins (``levels="page"``), which keep run J's tile (16 columns, no cap: under the cap they spill
    184 B, and they were 14-30 % slower with 8 columns in run K).

    The unmetered 64-token one-stage kernel faulted once under graph replay with the older
    untransposed loads (run G, never reproduced under memcheck); the transposed kernel is clean
    under memcheck (every tensor its own allocation), racecheck and synccheck (run J)."""
    many = programs_per_sm >= MANY_PROGRAMS_PER_SM
    capped = CAP_REGISTERS and scheme in CAPPED_SCHEMES
    if meter and levels == "page" and scheme != "none":
        return Tile(128, 1, 4, head_columns=16)
    if scheme in EIGHT_BIT_SCHEMES:
        if meter:
            if many and capped and scheme in ONE_WARP_METERED_SCHEMES and levels == "token" and block_size <= 32:
                return Tile(32, 1, 1, METERED_REGISTER_CAP, prefetch=METERED_ONE_WARP_PREFETCH)
            return Tile(128, 1, 4, METERED_REGISTER_CAP if capped else None)
        return Tile(64, 1, 4, UNMETERED_REGISTER_CAP if capped else None) if many else Tile(128, 1, 8)
    if scheme == "none":
        return Tile(128, 2, 4)
    return Tile(128, 1, 4) if meter else Tile(128, 2, 4)



def choose_splits(batch: int, kv_heads: int, max_len: int, block_size: int, sms: int, meter: bool | None = None,
                  scheme: str = "int8", levels: str = "token", head_dim: int = 128) -> int:
    """Split-KV count for a decode launch of ``batch × kv_heads`` (sequence, kv head) pairs over at
    most ``max_len`` tokens on a GPU of ``sms`` multiprocessors: at least two programs per
    multiprocessor and at least 16 splits (both measured on the H200, ``bench/tune_decode.py``,
    bench/RESULTS.md: more, shorter splits keep more bytes in flight than a few long ones), at
    most 64, and no split shorter than 8 pages: the base count, which the rules below may replace.
    The one split heuristic of the library.

    With ``meter`` (True / False: the launch's kernel) and a tile whose register cap fixes how many
    programs fit on a multiprocessor (``Tile.resident_programs``), a grid of fewer than ``FEW_WAVES``
    waves is sized to whole waves instead: the largest split count whose grid fills ⌊waves⌋ (at
    least one) waves of that many programs per SM (bench/RESULTS.md run L: one wave two thirds full cost
    the metered B 1 call 12-22 %, a second wave under a third full the unmetered B 8 call 10 %). A count
    that would change the tile is not taken.

    A grid too small for the many-program tiles at those counts (B 1-4 at 8 kv heads; ``SMALL_GRID_SCHEMES``:
    int8, pages no larger than those tiles) takes them anyway where the sequence is long enough: as many
    splits as fill one wave of their programs (metered: one warp, 32 tokens, twelve per SM; unmetered: 64
    tokens under the cap, six per SM), but no split shorter than ``SMALL_GRID_MIN_SPLIT_TOKENS`` tokens or
    one page, at most ``SMALL_GRID_MAX_SPLITS`` (past 64), nor more than the merge's measured partials per
    row allow at ``head_dim`` (``SMALL_GRID_MAX_PARTIALS``: the next power of two of the count times d); a
    count that fills less than ``SMALL_GRID_MIN_WAVE`` of the wave keeps the rules above. bench/RESULTS.md
    run R: a program's chain of tiles on a wave of small programs is shorter than a 4- or 8-warp program's
    chain of 128-token ones, and the unmetered B 2 call had run a second wave of eight programs; past 128
    splits at 32K the merge of 256 partials per row costs more than the shorter chains save.

    Last, a metered count other than the small grid's is cut to whole tiles (``METERED_WHOLE_TILES``): the fewest
    splits whose programs run as many tile iterations as it gave, where the tile stays the same (run Q7: 49
    splits of 1.3 128-token tiles at B 1 / 8K become 32 of two, 0.77-0.87× the call's time)."""
    pages = max(1, -(-max_len // block_size))
    pairs = max(1, batch * kv_heads)
    s = max(1, min(max(-(-2 * sms // pairs), 16), 64, pages // 8))
    if meter is None:
        return s
    tile = tile_config(meter, scheme, pairs * s / sms, levels, block_size)
    many = tile_config(meter, scheme, float(MANY_PROGRAMS_PER_SM), levels, block_size)
    if (scheme in SMALL_GRID_SCHEMES and many != tile and many.resident_programs() is not None
            and block_size <= many.tokens):
        # a small grid (too few pairs for MANY_PROGRAMS_PER_SM programs per SM at these counts): the
        # many-program tile (metered: one warp, 32 tokens; unmetered: 64 tokens, capped) on one wave of its
        # resident programs, at least SMALL_GRID_MIN_SPLIT_TOKENS tokens a split, where that grid takes it and
        # fills at least SMALL_GRID_MIN_WAVE of the wave (run R)
        wave = many.resident_programs() * sms
        s1 = min(wave // pairs, max_len // SMALL_GRID_MIN_SPLIT_TOKENS, pages, SMALL_GRID_MAX_SPLITS,
                 SMALL_GRID_MAX_PARTIALS // max(1, head_dim))
        if (s1 >= 1 and pairs * s1 >= SMALL_GRID_MIN_WAVE * wave
                and tile_config(meter, scheme, pairs * s1 / sms, levels, block_size) == many):
            if not meter and UNMETERED_WHOLE_TILES:
                return _whole_tiles(s1, max_len, many, pairs, sms, meter, scheme, levels, block_size)
            return s1
    per_sm = tile.resident_programs()
    if per_sm is not None:
        slots = per_sm * sms
        waves = pairs * s / slots
        if waves < FEW_WAVES:
            whole = max(1, min(max(1, int(waves)) * slots // pairs, 64, pages // 8))
            if tile_config(meter, scheme, pairs * whole / sms, levels, block_size) == tile:
                s = whole
    if METERED_WHOLE_TILES if meter else UNMETERED_WHOLE_TILES:
        s = _whole_tiles(s, max_len, tile, pairs, sms, meter, scheme, levels, block_size)
    return s


def _whole_tiles(s: int, max_len: int, tile: "Tile", pairs: int, sms: int, meter: bool, scheme: str, levels: str,
                 block_size: int) -> int:
    """The fewest splits whose programs run as many ``tile`` iterations as ``s`` splits, where the tile stays the same."""
    tiles = max(1, -(-max_len // (s * tile.tokens)))  # (an empty table, max_len 0: one iteration, as any count)
    fewer = max(1, -(-max_len // (tiles * tile.tokens)))
    if fewer < s and tile_config(meter, scheme, pairs * fewer / sms, levels, block_size) == tile:
        return fewer
    return s


_SMS: dict = {}


def sm_count(dev) -> int:
    """Multiprocessors of a device (cached; 4 off the GPU, where only the interpreter runs)."""
    if dev.type != "cuda":
        return 4
    if dev not in _SMS:
        _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _SMS[dev]


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """A decode launch's configuration, fixed from the shape before it runs (``plan_decode``)."""
    num_splits: int  # split-KV programs per (sequence, kv head): the grid's third axis
    tile: Tile  # the loop configuration the plan was derived from (``tile_config`` for the grid, or the caller's)
    pages_per_tile: int  # pages per loop iteration (PAGES)
    auto_tile: bool  # pages_per_tile is the tile's: halved and retried on OutOfResources (a caller's is kept)
    num_warps: int
    num_stages: int | None  # None: Triton's default (the interpreter)
    max_registers: int | None  # Triton's maxnreg (GPU only), None: the compiler's choice
    head_columns: int  # BLOCK_H: the query-head columns a program's tiles are padded to (≥ GQ)
    hist_split: str  # the histogram dot's operands: "bf16x2", "tf32x3" (fp32 in the interpreter) or "page"
    pack_hist: bool  # PACK_HIST: the bf16 hi / lo histogram operands in one dot (GQ ≤ head_columns / 2)
    prefetch: int  # PF_AHEAD: the next tile's codes, scales and witnesses prefetched into the L2 (GPU only)
    prefetch_bt: bool  # PREFETCH_BT: the next tile's block-table entries loaded one iteration ahead
    hist_columns: int  # NB: histogram columns per head (the tiers' bins + the Σ p̂ φ column, a power of two)
    # the kernel variant (``launch_variant``; ``decode`` refuses a plan made for another one)
    meter: bool
    levels: str  # "token" or "page" (PAGE_LEVELS)
    csr: bool  # SGLang's CSR rows (kv_indptr)
    lowp: bool  # tensor-core dots in q's dtype (the GPU); False: fp32 throughout (the interpreter)
    pv_f32: bool  # PV_F32: fp32 (tf32x3) PV operands for exact fp16 values that bf16 would round
    sketch_bits: int  # SKB: the key sketch's bits, 0 when not read
    weighted: bool  # the channel weights read
    tier_b: bool  # the Tier B bins (int8_dither with a delta_step)
    head_levels: bool  # HEAD_LEVELS: one key level per (token, query head) (``PagedKV.head_levels``)
    excess: bool = False  # EXC: the centred sketch box's excess sums beside the histogram (``EXCESS_FORM``)
    grid: bool = False  # GRD: with ``excess``, the same boxes' (t, λ) grid sums (``EXCESS_GRID``)


def launch_variant(cache: PagedKV, q_dtype: torch.dtype, device, meter: bool = True, levels: str = "token",
                   delta_step: float | None = None, repair: RepairOverlay | None = None,
                   window: ExactWindow | None = None, csr: bool = False) -> dict:
    """The kernel variant a launch needs (the ``DecodePlan`` fields below ``hist_columns``)."""
    lowp = not INTERPRET and torch.device(device).type == "cuda"
    has_rep = repair is not None and repair.count > 0
    has_win = window is not None and window.columns > 0
    fp16 = q_dtype == torch.float16
    excess = bool(EXCESS_FORM and meter and cache.scheme != "none" and (cache.sketch_bits > 0 or cache.has_weights))
    return dict(
        meter=meter, levels=levels, csr=csr, lowp=lowp,
        # the PV dot's operands on the GPU: bf16 (8-bit codes are exact in it; p̂·s_v keeps fp32's exponent range),
        # fp32 (tf32x3) where the values are exact fp16 that bf16 would round (scheme none, a repaired pool)
        pv_f32=lowp and fp16 and (cache.scheme == "none" or has_rep or has_win),
        sketch_bits=cache.sketch_bits if (meter and cache.scheme != "none") else 0,
        weighted=bool(meter and cache.has_weights),
        tier_b=meter and cache.scheme == "int8_dither" and delta_step is not None,
        head_levels=bool(meter and cache.weighted and cache.head_levels),
        excess=excess,
        grid=bool(excess and EXCESS_GRID),
    )


def _plan_tile(tile: Tile | None, meter: bool, scheme: str, programs_per_sm: float, levels: str,
               block_size: int) -> Tile:
    if tile is None:
        return tile_config(meter, scheme, programs_per_sm, levels, block_size)
    if not isinstance(tile, Tile):
        raise ValueError(f"tile: expected a kernels.plan.Tile, got {type(tile).__name__}")
    return tile


def _tile_pages(tile: Tile, block_size: int) -> int:
    """Pages per tile for ``tile``'s tokens (the interpreter keeps 128 tokens for the one-warp tile)."""
    tokens = tile.tokens
    if INTERPRET and tile.warps == 1:
        # a tile is a GPU scheduling choice (the same sums in another order), and the interpreter's time grows
        # with the tile count: its default path keeps the 4-warp tile's 128 tokens. The one-warp tiling runs
        # in the interpreter through an explicit pages_per_tile (test_decode_conformance_one_warp_tile)
        tokens = 128
        if not _LOGGED.get("one_warp"):
            log.info("decode in the interpreter: 128-token tiles where the GPU takes one-warp 32-token programs")
            _LOGGED["one_warp"] = True
    return max(1, tokens // block_size)


def _hist_split(hist_split: str | None, variant: dict) -> str:
    if hist_split is None:
        hist_split = "bf16x2"
    if hist_split not in ("bf16x2", "tf32x3"):
        raise ValueError(f"hist_split: expected 'bf16x2' or 'tf32x3', got {hist_split!r}")
    if not variant["lowp"]:
        hist_split = "tf32x3"  # the interpreter's fp32 (ieee) dot: no bf16 in kernels there
    if variant["meter"] and variant["levels"] == "page":
        hist_split = "page"  # fp32 sums, no operand split
    return hist_split


def _register_cap(tile: Tile, variant: dict) -> int | None:
    """The tile's register cap, raised for the sketch / weights, none for fp32 PV operands."""
    cap = tile.max_registers
    if (variant["sketch_bits"] or variant["weighted"]) and cap is not None:
        cap = max(cap, SKETCH_REGISTER_CAP)
    if variant["pv_f32"]:
        cap = None  # tf32x3 PV operands spill 0.6-1.3 KB under the 8-bit register caps (sm_90 SASS)
    return cap


def hist_columns(tier_b: bool) -> int:
    """NB, a decode's histogram columns per head: tier A's KA = KEY_LEVELS + 2 bins (and Tier B's as many) + the
    Σ p̂ φ column, rounded up to a power of two."""
    KA = KEY_LEVELS + 2
    return triton.next_power_of_2((2 * KA if tier_b else KA) + 1)


def plan_decode(cache: PagedKV, batch: int, q_heads: int, q_dtype: torch.dtype, device, capacity: int,
                meter: bool = True, levels: str = "token", hist_split: str | None = None,
                delta_step: float | None = None, repair: RepairOverlay | None = None,
                window: ExactWindow | None = None, csr: bool = False, num_splits: int | None = None,
                tile: Tile | None = None, pages_per_tile: int | None = None, num_warps: int | None = None,
                num_stages: int | None = None, prefetch_bt: bool | None = None) -> DecodePlan:
    """The plan of a decode of ``batch`` sequences of at most ``capacity`` tokens (the table's capacity,
    or any bound on the lengths; CSR: the mean length) with ``q_heads`` query heads of ``q_dtype`` on
    ``device``; the other arguments are ``decode``'s. ``num_splits`` None: ``choose_splits``; ``tile``
    None: ``tile_config`` for this grid; ``pages_per_tile`` / ``num_warps`` / ``num_stages`` None: the
    tile's."""
    if levels not in ("token", "page"):
        raise ValueError(f"levels: expected 'token' or 'page', got {levels!r}")
    variant = launch_variant(cache, q_dtype, device, meter, levels, delta_step, repair, window, csr)
    hist_split = _hist_split(hist_split, variant)
    dev = torch.device(device)
    Hkv, T = cache.num_kv_heads, cache.block_size
    if num_splits is None:
        num_splits = choose_splits(batch, Hkv, capacity, T, sm_count(dev), meter, cache.scheme, levels,
                                   cache.head_dim)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: expected a positive int, got {num_splits!r}")
    tile = _plan_tile(tile, meter, cache.scheme, batch * Hkv * num_splits / sm_count(dev), levels, T)
    if num_stages is None and not INTERPRET:
        num_stages = tile.stages
    head_columns = max(tile.head_columns, triton.next_power_of_2(q_heads // Hkv))
    # the bf16 hi / lo histogram operands packed into one dot where the padding columns can hold the lo parts
    pack = meter and hist_split == "bf16x2" and packs_histogram(q_heads // Hkv, head_columns)
    return DecodePlan(
        num_splits=num_splits, tile=tile, auto_tile=pages_per_tile is None,
        pages_per_tile=_tile_pages(tile, T) if pages_per_tile is None else pages_per_tile,
        num_warps=tile.warps if num_warps is None else num_warps, num_stages=num_stages,
        max_registers=_register_cap(tile, variant), head_columns=head_columns, hist_split=hist_split,
        pack_hist=pack,
        # the next tile's codes, scales and witnesses prefetched into the L2 while a tile computes (GPU only:
        # inline PTX; run Q also timed the L1: no better)
        prefetch=tile.prefetch if variant["lowp"] else 0,
        prefetch_bt=meter if prefetch_bt is None else bool(prefetch_bt),
        hist_columns=hist_columns(variant["tier_b"]),
        **variant,
    )


def plan_call(cache: PagedKV, q: torch.Tensor, block_table: torch.Tensor, csr: bool = False,
              force: dict | None = None, **kw) -> DecodePlan:
    """The plan ``decode`` makes for a call on ``q`` [B, Hq, D] and ``block_table`` (its capacity rule: the
    table's capacity, CSR: the flat table's mean row; no device sync), ``kw`` as for ``plan_decode``, then
    ``force``'s ``DecodePlan`` fields replaced (a benchmark's or a test's forced configuration: the
    register cap, the head columns, the packing, the prefetch)."""
    B = q.shape[0]
    cap = max(1, block_table.shape[0] // max(B, 1)) if csr else block_table.shape[1] * cache.block_size
    plan = plan_decode(cache, B, q.shape[1], q.dtype, q.device, cap, csr=csr, **kw)
    return dataclasses.replace(plan, **force) if force else plan


def check_plan(plan: DecodePlan, variant: dict, gq: int) -> None:
    """Refuse a plan made for another launch: the kernel variant, the head columns, the packing and the
    histogram split must be this launch's (the meter's constants are those of the kernel that ran)."""
    if not isinstance(plan, DecodePlan):
        raise ValueError(f"plan: expected a kernels.plan.DecodePlan, got {type(plan).__name__}")
    other = {k: (getattr(plan, k), v) for k, v in variant.items() if getattr(plan, k) != v}
    if other:
        raise ValueError(f"plan: made for another kernel variant (plan, launch): {other}")
    if plan.head_columns < triton.next_power_of_2(gq) or plan.head_columns & (plan.head_columns - 1):
        raise ValueError(f"plan: head_columns {plan.head_columns} cannot hold GQ {gq} query heads")
    if plan.pack_hist and not (plan.meter and plan.hist_split != "page" and packs_histogram(gq, plan.head_columns)):
        raise ValueError("plan: pack_hist needs the metered token-level histogram and GQ ≤ head_columns / 2")
    splits = {"page"} if plan.meter and plan.levels == "page" else {"bf16x2", "tf32x3"} if plan.lowp else {"tf32x3"}
    if plan.hist_split not in splits:
        raise ValueError(f"plan: hist_split {plan.hist_split!r} is not this launch's ({sorted(splits)})")
    if plan.prefetch not in (0, 1) or (plan.prefetch and not plan.lowp):
        raise ValueError(f"plan: prefetch {plan.prefetch!r}: 0, or 1 on the GPU")
    if not isinstance(plan.num_splits, int) or plan.num_splits < 1 or plan.pages_per_tile < 1:
        raise ValueError("plan: num_splits and pages_per_tile must be positive")
    if plan.hist_columns != hist_columns(plan.tier_b):
        raise ValueError("plan: hist_columns is not the tiers' bins + 1, rounded up to a power of two")


#: warps per program of the fused merge (one program per row). With the meter record: four (the tilt is
#: a float64 grid search that wants the threads; bench/merge_probe.py, run N2, d 128, every row tilted:
#: 51.4 / 54.1 µs at B 1 / 8 with four warps, 95.6 / 90.7 with one), except on grids of at least
#: MERGE_RECORD_ONE_WARP_ROWS_PER_SM rows per SM, where one warp per row is faster whatever the tilt does
#: (B 32, Hq 32: 1024 rows on 132 SMs, every row tilted 120.2 µs with one warp against 164.5 with four;
#: no row tilted 13.2 against 33.0). Without the record (the unmetered merge, or the histograms alone): one
#: while a row's partial outputs (SP × D floats) are at most MERGE_ONE_WARP_ELEMS (run M: unmetered 7.1 / 8.0 /
#: 9.4 µs against 7.5 / 7.8 / 10.0 with four, histograms 9.4 / 9.6 / 11.2 against 9.4 / 9.4 / 13.5), else four
#: (not measured).
MERGE_ONE_WARP_ELEMS = 64 * 128
MERGE_RECORD_WARPS = 4
MERGE_RECORD_ONE_WARP_ROWS_PER_SM = 4
#: warps per program of a record merge that tilts no row (the tilt deferred to ``kernels.tilt_batch``, or τ = +inf);
#: None: the tilting merge's rule above. The four warps are there for the tilt's grid search; without it a row's
#: record is a chain of float64 steps and reductions, each of which four warps pass through shared memory behind
#: barriers (ncu, bench/RESULTS.md run F3: the B 1 / 32K record merge 13 µs of a ~65 µs call, 3,100 instructions a
#: warp at 6.7 cycles each, 64 barriers a warp). One warp (run N2 at B 32: 13.2 against 33.0 µs with no row tilted)
#: lost at B 1-8 (run F5, an H100, ``bench/merge_warps_ab.py``, whole call: B 1 / 32K 1.14× the time with the group
#: radius, 1.19× with the default's; B 8 0.98-1.00×; SGLang's fp8 call at B 8 unchanged): the chain, not the
#: barriers, is the time. So None
MERGE_UNTILTED_WARPS: int | None = None
#: a deferred record (``kernels.tilt_batch``, a graphed step's layers) leaves the closed forms too to the step's one
#: finishing launch: the per-call merge stores the merged excess sums (``epilogue_jit._merge_meter_kernel``'s
#: DEFER_FORMS) instead of running the excess and grid forms, tanh, the e-form and ρ in float64; the finish runs them
#: batched over every layer's rows. Measured (bench/RESULTS.md runs G1, G4, an H100): 0.88-0.97× a metered layer's
#: time at B 1, 0.97-1.00× at B 8 (bench/tilt_batch_probe.py). (G4's split of SGLang's merge, 16 µs with the forms or
#: without, timed a second capture's merge, whose tilt was fused: runs I2-I3; the deferred merge there is 6.8-7.2 µs.)
#: Read by ``TiltBatch.allocate`` (a batch keeps its mode)
DEFER_FORMS = True
#: programs per row of a deferred record's merge (``epilogue_jit._merge_meter_kernel``'s PARTS, with DEFER_FORMS): 1, the
#: one-program merge; 2, the histograms and the excess sums in a second program beside the output and the record's
#: scalars; 3, the output apart too. The programs run at once and the row's last to arrive writes the pending record
#: (the same values, bit for bit). Why: that merge is a latency chain (run F3: 3,100 instructions a warp at 6.7 cycles
#: each, the GPU's issue slots 3 % busy) on a grid of B·Hq programs, 32-256 at B 1-8 for 132 SMs: shorter chains side
#: by side. Measured (bench/RESULTS.md runs H1, H3, an H100): the default kernel's merge alone at B 1 10.8 → 7.5 µs
#: (32K), 7.5 → 6.5 (4K), at B 8 8.0 → 8.1; a graphed step's layer (bench/tilt_batch_probe.py) 0.966× at B 1 / 4K and
#: 32K, 1.000× at B 8 / 4K (two parts: 0.969 / 0.974 at B 1). Read by ``epilogue.merge`` at call time (a benchmark sets
#: it: bench/merge_parts.py)
MERGE_PARTS = 3
#: warps per program of the merge in parts (``epilogue.merge`` with ``num_warps`` None and MERGE_PARTS > 1); None:
#: ``merge_warps``' count, the one-program merge's, whose output o is then the same bit for bit (its fp32 sum over the
#: splits runs in the same order). One warp was faster (run H1, an H100: the B 1 merge alone 5.7-6.4 µs against
#: 6.5-8.2 at four; run H2: a graphed step's B 1 layer 0.95-0.96× the one-program merge's) but its o differs from the
#: one-program merge's in the last bits (relative 6e-6; run H2's GPU tests: the graphed and eager records then differ by
#: 6e-10 in E⁺ through the store's term): a graphed step would not serve what an eager call serves. So None
MERGE_PARTS_WARPS: int | None = None


def merge_parts_setting() -> tuple[int, int | None]:
    """(``MERGE_PARTS``, ``MERGE_PARTS_WARPS``) checked, as ``epilogue.merge`` reads them: 1, 2 or 3 programs a row;
    None or 1, 2, 4, 8 warps."""
    parts, warps = MERGE_PARTS, MERGE_PARTS_WARPS
    if type(parts) is not int or parts not in (1, 2, 3):
        raise ValueError(f"kernels.plan.MERGE_PARTS: expected 1, 2 or 3, got {parts!r}")
    if warps is not None and (type(warps) is not int or warps not in (1, 2, 4, 8)):
        raise ValueError(f"kernels.plan.MERGE_PARTS_WARPS: expected None or 1, 2, 4 or 8, got {warps!r}")
    return parts, warps


def merge_warps(sp: int, d: int, record: bool, rows: int = 0, sms: int = 0, tilts: bool = True) -> int:
    """Warps per program of the fused merge for ``sp`` (power of two ≥ S) partials of ``d`` channels, over
    ``rows`` programs on ``sms`` SMs (0: unknown, e.g. off the GPU); ``tilts``: the record may tilt a row."""
    if record and not tilts and MERGE_UNTILTED_WARPS:
        return MERGE_UNTILTED_WARPS
    if record:
        return 1 if sms and rows >= MERGE_RECORD_ONE_WARP_ROWS_PER_SM * sms else MERGE_RECORD_WARPS
    return 1 if sp * d <= MERGE_ONE_WARP_ELEMS else 4
