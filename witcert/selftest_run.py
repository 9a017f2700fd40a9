"""``witcert selftest``: the kernel path's self-checks (``witcert.selftest``: the write and the exact window's write;
``witcert.selftest_decode``: the metered decode) run on demand for a serving configuration, before deploying it on a
GPU, without a model: the checks a ``WitCertCache`` on the kernel path runs at its first use, here for each scheme asked.

    witcert selftest --device cuda --scheme int8,fp8_e4m3 --head-dim 128 --kv-heads 8 --q-heads 32 \\
        --dtype bfloat16 --batch 8 --context 32768 [--window 4,64] [--sketch-bits B] [--json]

Each scheme's cache is laid out as ``WitCertCache``'s kernel path allocates it (one per-token witness group, the
scheme's default sketch, no channel weights — a model's calibrated weights are powers of two and take the same code —
its default per-head levels, the window) and decoded with the plan of a batch of ``--batch`` sequences at ``--context``
tokens. Exit status 0 when every check passed, 1 when one failed (its message printed), 2 on bad arguments.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch


@dataclasses.dataclass(frozen=True)
class SelfTestLine:
    """One scheme's outcome: passed or not, the decode check's rows / smallest TV⁺ ÷ supremum / largest error ÷ E⁺ and
    informative rows (None where it did not get that far), and the error message of a failure."""

    scheme: str
    passed: bool
    decode_rows: int | None = None
    worst_tv_ratio: float | None = None
    worst_err_ratio: float | None = None
    informative_rows: int | None = None
    error: str | None = None


def run_one(scheme: str, *, device: str, dtype: torch.dtype, head_dim: int, kv_heads: int, q_heads: int, batch: int,
            context: int, window: tuple[int, int], sketch_bits: int | None) -> SelfTestLine:
    """The write, window and decode self-checks of one scheme's configuration (module doc), each run afresh."""
    from contract.schemes import KERNEL_SCHEME_IDS, SCHEMES
    from kernels.exact_window import ExactWindow
    from kernels.paged import PagedKV
    from kernels.plan import plan_decode

    from . import selftest, selftest_decode
    from .cache_args import default_sketch_bits

    if scheme not in KERNEL_SCHEME_IDS:
        return SelfTestLine(scheme=scheme, passed=False, error=f"{scheme!r} has no kernel (the reference path meters it)")
    bits = default_sketch_bits(sketch_bits, scheme, 1, "token")
    head_levels = bool(bits) and SCHEMES[scheme].kernel_head_levels
    try:
        paged = PagedKV.allocate(8, kv_heads, head_dim, scheme=scheme, num_groups=1, per_token_witness=True,
                                 model_dtype=dtype, device=device, with_exact=False, sketch_bits=bits,
                                 head_levels=head_levels, block_norms=True)
        selftest.check_write_kernel(paged, dtype, force=True)  # (on demand: even if this process checked it)
        win = ExactWindow.allocate(batch, kv_heads, head_dim, dtype, *window, device=device) if sum(window) else None
        if win is not None:
            selftest.check_window_kernel(win, dtype, force=True)
        plan = plan_decode(paged, batch, q_heads, dtype, device, context, meter=True, window=win)
        width = -(-context // paged.block_size)
        r = selftest_decode.check_decode_kernel(paged, plan, dtype, head_dim ** -0.5, q_heads, window=win, batch=batch,
                                                table_width=width, out_dtype=dtype, force=True)
    except selftest.WriteSelfTestError as e:  # (DecodeSelfTestError is one)
        return SelfTestLine(scheme=scheme, passed=False, error=str(e))
    return SelfTestLine(scheme=scheme, passed=True, decode_rows=r.rows, worst_tv_ratio=r.worst_tv_ratio,
                        worst_err_ratio=r.worst_err_ratio, informative_rows=r.informative_rows)


def main(args) -> int:
    """``witcert selftest`` (``witcert.cli``): one line per scheme (or JSON), exit status 1 if any failed."""
    device = args.device
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("witcert selftest: error: on the CPU the kernels run only in Triton's interpreter: set TRITON_INTERPRET=1 "
              "(before anything imports triton), or pass --device cuda", flush=True)
        return 2
    dtype = {"auto": torch.bfloat16 if device != "cpu" else torch.float32, "float32": torch.float32,
             "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    if args.q_heads % args.kv_heads or args.q_heads // args.kv_heads > 8:
        print(f"witcert selftest: error: --q-heads {args.q_heads} must be a multiple of --kv-heads {args.kv_heads}, at "
              "most 8 times it (the kernels' GQ ≤ 8)")
        return 2
    lines = [run_one(s, device=device, dtype=dtype, head_dim=args.head_dim, kv_heads=args.kv_heads,
                     q_heads=args.q_heads, batch=args.batch, context=args.context, window=args.window,
                     sketch_bits=args.sketch_bits) for s in args.scheme]
    if args.json:
        print(json.dumps([dataclasses.asdict(x) for x in lines], indent=1))
    else:
        name = torch.cuda.get_device_name(torch.device(device)) if device != "cpu" else "CPU (Triton's interpreter)"
        print(f"# {name}, {dtype}, d {args.head_dim}, {args.kv_heads} / {args.q_heads} heads, batch {args.batch}, "
              f"context {args.context}, window {args.window}")
        for x in lines:
            if x.passed:
                print(f"{x.scheme:16s} passed  (decode: {x.decode_rows} rows, {x.informative_rows} with TV+ < 1, "
                      f"TV+ / supremum >= {x.worst_tv_ratio:.4g}, error / E+ <= {x.worst_err_ratio:.3g})")
            else:
                print(f"{x.scheme:16s} FAILED  {x.error}")
    return 0 if all(x.passed for x in lines) else 1
