"""Compile the epilogue's kernels (``kernels.epilogue_jit``; the merge with DEFER, ``kernels.tilt_batch``), the
exact window's write (``kernels.exact_window``) and the fp8 schemes' KV write with its own saturated cast
(``kernels.write``) for sm_90 on the CPU, without a GPU: ``python -m tests.helpers.epilogue_codegen WARPS...``
prints ``ok <kernel> <warps>`` per compile, or ``FAILED <kernel> <warps>: <error>``, and exits 1 on any failure. Run
without ``TRITON_INTERPRET`` (under it a jitted function is an interpreter object). The constants are the GPU's:
``DENSE3D`` off (``epilogue._dense3d``), the tilt's grid and chunk from the modules, the merge's from an int8 metered
decode (D 128, 4 splits, GQ 4, sketch weights; captured from ``kernels.epilogue.merge``)."""
from __future__ import annotations

import re
import sys


def _tv_kernel(E, EJ):
    sig = {"MASS": "*fp64", "LV": "*fp64", "RMAX": "*fp64", "XI": "*fp64", "LAM": "*fp64", "OUT": "*fp64",
           "SCR": "*fp64", "s_m": "i32", "s_l": "i32", "tilt_above": "fp32", "tilt_hi": "fp32"}
    const = {"NB": 31, "NBP": 32, "N1": EJ.COARSE, "RT": EJ.REFINE_TOP, "NR": EJ.REFINE, "EPSC": E._epsc(32),
             "DENSE3D": False, "TC": EJ.TILT_CHUNK}
    return EJ._tv_kernel, sig, const


def _merge_meter_kernel(E, EJ):
    ptr = {"M_IN": "fp32", "L_IN": "fp32", "ACC_IN": "fp32", "HIST_IN": "fp32", "STAT_IN": "fp32", "Q": "bf16",
           "SL": "i32", "EDGES": "fp64", "O": "fp32", "LSE": "fp32", "REC": "fp64", "HOUT": "fp64", "SCR": "fp64",
           "FLAG": "i8", "WGT": "fp32", "EX_IN": "fp32", "EXS": "fp64", "PRT": "fp64", "CNT": "i32"}
    sig = {k: "*" + v for k, v in ptr.items()}
    sig |= {"Hq": "i32", "S": "i32", "sm": "fp32", "qn_infl": "fp32", "log_delta": "fp32", "tilt_above": "fp32",
            "tilt_hi": "fp32", "s_qb": "i32", "s_qh": "i32", "s_ob": "i32", "s_oh": "i32", "s_lb": "i32", "s_lh": "i32"}
    const = {"D": 128, "SP": 4, "T": 16, "PAGES": 8, "NB": 32, "KA": 31, "KP": 32, "METER": True, "EPI": True,
             "TIER_B": False, "GAMMA": 2.0**-16 * 1.25, "EXP_REL": 2.0**-20, "DITHER_U": 0.0, "ETA0": 5.2e-05,
             "ETA1": 1.1e-06, "FLUSH": 2.0**-100, "OUT_REL0": 0.0, "BIAS": 2.0**-14, "N1": EJ.COARSE,
             "RT": EJ.REFINE_TOP, "NR": EJ.REFINE, "EPSC": E._epsc(32), "DENSE3D": False, "TC": EJ.TILT_CHUNK,
             "HA_HM": True, "WEIGHTED": True, "GQ": 4, "RING_TILES": 0, "DEFER": False, "LSE_W": 1, "LSE_WP": 1,
             "SL_CSR": False, "STORE_REL": 0.0, "STORE_ABS": 0.0, "STORE_MAX": 0.0, "EXC": True, "GRD": True,
             "GDC": False, "DEFER_FORMS": False, "PARTS": 1}
    return EJ._merge_meter_kernel, sig | {k: "constexpr" for k in const}, const


def _merge_meter_kernel_deferred(E, EJ):
    fn, sig, const = _merge_meter_kernel(E, EJ)
    return fn, sig, const | {"DEFER": True, "DEFER_FORMS": True}


def _merge_meter_kernel_parts(E, EJ):
    """The deferred merge in three programs per row (``kernels.plan.MERGE_PARTS``; two share its code paths)."""
    fn, sig, const = _merge_meter_kernel_deferred(E, EJ)
    return fn, sig, const | {"PARTS": 3}


def _merge_meter_kernel_sglang_parts(E, EJ):
    """The SGLang call's merge in three programs a row (its store's term, CSR lengths and attn_lse columns)."""
    fn, sig, const = _merge_meter_kernel_sglang(E, EJ)
    return fn, sig, const | {"DEFER_FORMS": True, "PARTS": 3}


def _check_arrival(name: str, ptx: str) -> None:
    """Raise unless the merge in parts arrives as ``epilogue_jit._merge_in_parts`` says: one ``atom.global.gpu.acq_rel
    .add`` (the row's counter), a ``bar.sync`` between every global store before it and it, and every global load after
    it through the L2 (``ld.global.cg``: the other programs' hand-over, no stale L1 line)."""
    lines = [x.strip() for x in ptx.splitlines()]
    atoms = [i for i, x in enumerate(lines) if "atom.global" in x]
    if len(atoms) != 1 or "atom.global.gpu.acq_rel.add" not in lines[atoms[0]]:
        raise AssertionError(f"{name}: expected one atom.global.gpu.acq_rel.add, got {[lines[i] for i in atoms]}")
    a = atoms[0]
    last_store = max((i for i in range(a) if lines[i].startswith(("st.global", "@")) and "st.global" in lines[i]),
                     default=-1)
    if not any("bar.sync" in lines[i] for i in range(last_store + 1, a)):
        raise AssertionError(f"{name}: no bar.sync between the last global store (line {last_store}) and the atomic")
    after = [x for x in lines[a + 1:] if "ld.global" in x]
    if not after or any("ld.global.cg" not in x for x in after):
        raise AssertionError(f"{name}: global loads after the atomic not all .cg: {after[:4]}")


def _merge_meter_kernel_sglang(E, EJ):
    """The merge as the SGLang call launches it: SGLang's bf16 ``o`` and its ``attn_lse`` columns written by the
    merge (the store's rounding in E⁺), the lengths read from ``kv_indptr``, the tilt deferred."""
    from kernels.fp_bounds import store_terms

    fn, sig, const = _merge_meter_kernel(E, EJ)
    rel, ab, mx = store_terms("bfloat16", "float32", const["D"])
    from kernels.plan import DEFER_FORMS

    return fn, sig | {"O": "*bf16"}, const | {"DEFER": True, "DEFER_FORMS": DEFER_FORMS, "LSE_W": 16, "LSE_WP": 16,
                                                "SL_CSR": True,
                                                "STORE_REL": rel, "STORE_ABS": ab, "STORE_MAX": mx}


def _finish_tilt_kernel(E, EJ):
    from kernels import tilt_batch as TB

    sig = {"HOUT": "*fp64", "REC": "*fp64", "FLAG": "*i8", "EDGES": "*fp64", "SCR": "*fp64", "EXS": "*fp64",
           "tilt_above": "fp32", "tilt_hi": "fp32"}
    const = {"NB": 32, "KA": 31, "KP": 32, "N1": EJ.COARSE, "RT": EJ.REFINE_TOP, "NR": EJ.REFINE, "EPSC": E._epsc(32),
             "DENSE3D": False, "TC": EJ.TILT_CHUNK, "FORMS": True, "EXC": True, "GRD": True}
    return TB._finish_tilt_kernel, sig | {k: "constexpr" for k in const}, const


def _window_write_kernel(E, EJ):
    from kernels import exact_window as W

    sig = {"SEQ": "*i64", "POS": "*i64", "NE": "*i64", "K": "*bf16", "V": "*bf16", "RK": "*bf16", "RV": "*bf16",
           "RKN": "*fp32", "RVN": "*fp32", "ne_int": "i32", "N": "i32", "s_kn": "i32", "s_kh": "i32", "s_vn": "i32", "s_vh": "i32",
           "sink": "i32", "recent": "i32", "H": "i32", "C1": "i32"}
    const = {"INFL": 1.0 + 2.0**-12, "D": 128, "BLOCK_T": 16, "NE_TENSOR": True}
    return W._window_write_kernel, sig | {k: "constexpr" for k in const}, const


def _write_kernel_fp8(scheme):
    """The KV write kernel of a raw / scaled fp8 scheme as the GPU launches it (its own cast, saturated: PRECODED off,
    which the interpreter never runs); D 128, G 1 per-token witnesses, ν / κ as float32 page maxima (the atomic max
    of ``PagedKV.block_norms``, the cache's layout), the 2-bit sketch with weights."""
    def make(E, EJ):
        from kernels import write as W
        from kernels.ids import FP8_E4M3_ID, FP8_E4M3_SCALED_ID, FP8_E5M2_ID

        code = {"fp8_e4m3": "fp8e4nv", "fp8_e5m2": "fp8e5", "fp8_e4m3_scaled": "fp8e4nv"}[scheme]
        sid = {"fp8_e4m3": FP8_E4M3_ID, "fp8_e5m2": FP8_E5M2_ID, "fp8_e4m3_scaled": FP8_E4M3_SCALED_ID}[scheme].value
        ptr = {"K": "bf16", "V": "bf16", "SLOT": "i64", "POS": "i64", "GID": "i32", "KC": code, "VC": code,
               "KS": "fp16", "VS": "fp16", "KZ": "fp16", "VZ": "fp16", "KW": "fp16", "VW": "fp16", "VN": "fp32",
               "KN": "fp32", "EK": "bf16", "EV": "bf16", "PK": code, "PV": code, "SK": "u8", "WGT": "fp32"}
        sig = {k: "*" + v for k, v in ptr.items()}
        sig |= {k: "i32" for k in ("seed", "layer", "N", "s_kn", "s_kh", "s_vn", "s_vh", "s_cb", "s_ch", "s_ct", "s_sb",
                                    "s_sh", "s_st", "s_vsb", "s_vsh", "s_vst", "s_eb", "s_eh", "s_et", "s_wb", "s_wh",
                                    "s_wt", "s_vwb", "s_vwh", "s_nb", "s_nh", "s_skb", "s_skh", "s_skt")}
        const = {"INFL": 1.0 + 2.0**-12, "FLOOR": 2.0**-126, "DIV_INT8": 127.0, "DIV_DITHER": 126.5, "D": 128, "T": 16,
                 "G": 1, "BLOCK_T": 4, "SCHEME": sid, "PRECODED": False, "PER_TOKEN": True, "STORE_EXACT": False,
                 "SKB": 2, "WEIGHTED": True, "SK_GAMMA": 2.0**-16, "NORMS_PT": False}
        return W._write_kernel, sig | {k: "constexpr" for k in const}, const

    make.__name__ = f"_write_kernel[{scheme}]"
    return make


#: the fp8 write's saturation is its cast's (``kernels.write._fp8_codes``): PTX's satfinite conversion of each format,
#: fed by the division by the scale and nothing else (any clip between them miscompiled on the H100, runs A5 / B3)
SATFINITE = {"fp8_e4m3": "cvt.rn.satfinite.e4m3x2.f32", "fp8_e4m3_scaled": "cvt.rn.satfinite.e4m3x2.f32",
             "fp8_e5m2": "cvt.rn.satfinite.e5m2x2.f32"}


def _check_saturating_cast(name: str, ptx: str) -> None:
    """Raise unless the write's PTX converts with its format's satfinite cvt and every operand of those casts is
    defined by a ``div.rn.f32`` (x / s): a clip in any form (min / max, ``min.xorsign.abs`` from ``tl.clamp``,
    ``selp`` from a nested ``tl.where``, an fp16 round trip) would define them instead."""
    scheme = name[name.index("[") + 1:-1]
    lines = ptx.splitlines()
    casts = [line for line in lines if SATFINITE[scheme] in line]
    if not casts:
        raise AssertionError(f"{SATFINITE[scheme]} not in the PTX: the fp8 codes would not saturate at code_max")
    defs: dict[str, list[str]] = {}
    for line in lines:
        m = re.match(r"\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+(%r\d+)\s*,", line)
        if m:
            defs.setdefault(m.group(2), []).append(m.group(1))
    for line in casts:
        for reg in re.findall(r"%r\d+\b", line.split(SATFINITE[scheme], 1)[1]):
            if defs.get(reg) != ["div.rn.f32"]:
                raise AssertionError(f"the cast's operand {reg} is defined by {defs.get(reg)}, not the division alone: "
                                     f"a clip before the cast ({line.strip()})")


def main(argv: list[str]) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels import epilogue as E
    from kernels import epilogue_jit as EJ

    bad = 0
    tilted = (_tv_kernel, _merge_meter_kernel, _merge_meter_kernel_deferred, _merge_meter_kernel_parts,
              _finish_tilt_kernel)
    # the tilt's kernels with the coarse grid alone (RT 0, the default) and with the refinement (RT 8)
    writes = tuple(_write_kernel_fp8(s) for s in ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled"))
    arrivals = (_merge_meter_kernel_parts, _merge_meter_kernel_sglang_parts)
    for rt, makes in ((0, tilted + (_merge_meter_kernel_sglang, _merge_meter_kernel_sglang_parts, _window_write_kernel)
                       + writes), (8, tilted)):
        EJ.REFINE_TOP = rt
        for make in makes:
            fn, sig, const = make(E, EJ)
            for warps in (int(w) for w in argv):
                try:
                    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                                       target=GPUTarget("cuda", 90, 64), options={"num_warps": warps})
                    if make in writes:
                        _check_saturating_cast(make.__name__, k.asm["ptx"])
                    if make in arrivals:
                        _check_arrival(make.__name__, k.asm["ptx"])
                    print(f"ok {make.__name__} RT {const.get('RT')} {warps}")
                except Exception as exc:  # noqa: BLE001 - reported, and the exit status says it
                    bad += 1
                    print(f"FAILED {make.__name__} RT {const.get('RT')} {warps}: {type(exc).__name__} {str(exc)[:300]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1", "4"]))
