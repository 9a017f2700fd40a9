# H4 (2026-12-07, twenty-ninth session): E⁺'s additive part in explicit FMAs (merge_terms._extra) in both merges; the
# GPU tests of the changed paths at MERGE_PARTS 3; carry [".whl", ".carry/sg"]
source bench/device_suite.sh > $OUT/setup.log 2>&1
suite 200 8 tests/kernels/test_merge_parts.py tests/kernels/test_tilt_batch.py tests/cache/test_graphs.py \
  tests/integrations/test_sglang_graphs.py tests/kernels/test_kernel_epilogue.py tests/kernels/test_decode_outputs.py \
  tests/kernels/test_excess_form.py 2>&1 | tail -8
