"""Timing probe (bench/SGLANG.md run X): ``bench/sglang_h200.py`` with the decode's unmetered-slot count off
(``unmetered=None`` in every call), to measure what the count costs. Its records are not sound for unmetered slots: a
probe, never a configuration.

    python3 bench/sglang_no_count.py --sglang-root … --batches 8 --lens 32768 --kv bf16,fp8 --iters 50
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels.decode as kd  # noqa: E402

_decode = kd.decode


def _without_count(*args, **kwargs):
    kwargs["unmetered"] = None
    return _decode(*args, **kwargs)


if __name__ == "__main__":
    kd.decode = _without_count  # metered_decode imports it at call time
    sys.argv = [os.path.join(os.path.dirname(__file__), "sglang_h200.py")] + sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
