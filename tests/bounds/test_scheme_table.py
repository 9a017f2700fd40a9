"""The scheme table (contract.schemes) is the one source of scheme facts: the reference registry,
the kernels' ids / code dtypes / constexpr globals, the cache's kernel and block checks and the
memory accounting all agree with it; the layering (kernels/ and contract/ never import witcert/)."""

import ast
import pathlib

import pytest
import torch

from contract import schemes as T

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_table_rows_and_derived_sets(monkeypatch):
    assert list(T.SCHEMES) == ["none", "int8", "int8_dither", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int4_group",
                               "kivi2"]
    assert T.KERNEL_SCHEME_IDS == {"none": 0, "int8": 1, "int8_dither": 2, "fp8_e4m3": 3, "fp8_e5m2": 4,
                                   "fp8_e4m3_scaled": 5, "int4_group": 6, "kivi2": 7}
    assert T.BLOCK_SCHEMES == frozenset({"kivi2"})
    assert [n for n, r in T.SCHEMES.items() if not r.lossy] == ["none"]
    assert [n for n, r in T.SCHEMES.items() if r.position_keyed] == ["int8_dither"]
    assert {n: r.divisor for n, r in T.SCHEMES.items() if r.divisor is not None} == {
        "int8": 127.0, "int8_dither": 126.5, "fp8_e4m3_scaled": 448.0, "int4_group": 15.0, "kivi2": 3.0}
    # the asymmetric schemes' divisor is their largest code: 2^bits − 1
    assert all(T.SCHEMES[n].divisor == 2 ** T.SCHEMES[n].code_bits - 1 for n in ("int4_group", "kivi2"))
    assert {n: r.codes_per_byte for n, r in T.SCHEMES.items() if r.codes_per_byte != 1} == {"int4_group": 2, "kivi2": 4}
    assert T.kernel_id("int4_group") == 6 and T.kernel_id("kivi2") == 7 and T.kernel_supported("kivi2")
    assert not T.kernel_supported("my_user_scheme")
    with pytest.raises(ValueError, match="unknown"):
        T.kernel_id("my_user_scheme")
    monkeypatch.setitem(T.SCHEMES, "x", T.Scheme("x", None, None, 8, "", "token", "none", "none"))  # a reference-only row
    with pytest.raises(ValueError, match="has no kernel"):
        T.kernel_id("x")
    with pytest.raises(ValueError, match="do not fit a byte"):
        T.Scheme("x", None, "uint8", 4, "", "token", "none", "none", codes_per_byte=4)
    with pytest.raises(ValueError, match="unknown"):
        T.scheme("int3")
    with pytest.raises(ValueError, match="granularity"):
        T.Scheme("x", None, None, 8, "", "tile", "none", "none")


def test_consumers_read_the_table():
    from kernels import ids as I
    from kernels import paged as P
    from kernels import write as W
    from witcert import cache as C
    from witcert import schemes as S
    from witcert.integrations import sglang as SG

    assert set(S.available_schemes()) >= set(T.SCHEMES)
    assert P.SCHEME_IDS == T.KERNEL_SCHEME_IDS  # the public re-export
    assert P.CODE_DTYPES == {"int8": torch.int8, "int8_dither": torch.int8, "fp8_e4m3": torch.float8_e4m3fn,
                             "fp8_e5m2": torch.float8_e5m2, "fp8_e4m3_scaled": torch.float8_e4m3fn,
                             "int4_group": torch.uint8, "kivi2": torch.uint8}
    assert {n: I.__dict__[n.upper() + "_ID"].value for n in P.SCHEME_IDS} == P.SCHEME_IDS
    assert (I.INT4_DIVISOR.value, I.FP8_SCALED_DIVISOR.value, I.GROUP.value, I.KIVI2_DIVISOR.value) == (15.0, 448.0, 32, 3.0)
    assert (W.KERNEL_DITHER_DIVISOR, W.KERNEL_INT8_DIVISOR) == (126.5, 127.0)
    # the raw fp8 casts' saturation: the code dtype's largest finite value (the GPU write saturates there by its own
    # satfinite cast, which the sm_90 codegen test requires; no kernel constant)
    assert {n: r.code_max for n, r in T.SCHEMES.items() if r.code_max is not None} == {
        n: float(torch.finfo(P.CODE_DTYPES[n]).max) for n in ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled")}
    assert (S.INT8_DITHER_DIVISOR, S.INT8_DIVISOR, S.FP8_E4M3_MAX, S.INT4_DIVISOR, S.KIVI2_DIVISOR) == (
        126.5, 127.0, 448.0, 15.0, 3.0)
    assert C.BLOCK_SCHEMES is T.BLOCK_SCHEMES
    assert [n for n in T.SCHEMES if C._kernel_scheme(n)] == ["int8", "int8_dither", "fp8_e4m3", "fp8_e5m2",
                                                             "fp8_e4m3_scaled", "int4_group", "kivi2"]
    assert SG.OUR_SCHEMES == ("int8", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_scaled", "int4_group")


@pytest.mark.parametrize("scheme,want", [
    # codes (K + V) + scales + (G + 3) fp16 witnesses: D = 128, G = 4, per token, T = 16
    ("none", (256 * 2, 0, 0)),
    ("int8", (256, 4, 14)),
    ("int8_dither", (256, 4, 14)),
    ("fp8_e4m3", (256, 0, 14)),
    ("fp8_e4m3_scaled", (256, 4, 14)),
    ("int4_group", (128.0, 32, 14)),  # fp16 scale + zero per 32 channels, K and V
    # four 2-bit codes per byte; keys: fp16 scale + zero per channel per block of 16, values per 32 channels
    ("kivi2", (64.0, 2 * 2 * 128 / 16 + 16, 14)),
])
def test_bytes_per_token_pinned(scheme, want):
    from kernels.memory_accounting import bytes_per_token

    r = bytes_per_token(scheme, head_dim=128, num_groups=4)
    assert (r["codes"], r["scales"], r["witnesses"]) == want
    assert r["total"] == sum(want) and r["ratio_vs_model_dtype"] == 512 / sum(want)
    with pytest.raises(ValueError, match="unknown"):
        bytes_per_token("int3")


def test_paged_shapes_follow_the_table():
    from kernels.paged import PagedKV

    c = PagedKV.allocate(2, 2, 128, "int4_group")
    assert c.k_codes.shape == (2, 2, 16, 64) and c.k_codes.dtype == torch.uint8
    assert c.k_scale.shape == c.k_zero.shape == (2, 2, 16, 4)
    c = PagedKV.allocate(2, 2, 128, "int8")
    assert c.k_codes.shape == (2, 2, 16, 128) and c.k_scale.shape == (2, 2, 16) and c.k_zero.shape == (1,)
    c = PagedKV.allocate(1, 1, 64, "none", model_dtype=torch.float16)
    assert c.k_codes.dtype == torch.float16
    c = PagedKV.allocate(3, 2, 128, "kivi2")  # a page is one key block: key scale / zero per channel
    assert c.k_codes.shape == c.v_codes.shape == (3, 2, 16, 32) and c.k_codes.dtype == torch.uint8
    assert c.k_scale.shape == c.k_zero.shape == (3, 2, 128)
    assert c.v_scale.shape == c.v_zero.shape == (3, 2, 16, 4)
    with pytest.raises(ValueError, match="kernels support"):
        PagedKV.allocate(1, 1, 64, "my_user_scheme")


def _imports(pkg):
    out = set()
    for f in (ROOT / pkg).rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                out |= {(f.name, a.name.split(".")[0]) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add((f.name, node.module.split(".")[0]))
    return out


def test_layers_point_down():
    assert not [x for x in _imports("kernels") if x[1] == "witcert"]
    assert not [x for x in _imports("contract") if x[1] in ("witcert", "kernels", "proofs_bridge")]
