"""bench/tightness_gpu.py with witcert.selftest's log (the write and decode self-checks' outcomes) on stderr: run C4."""
import logging
import sys

sys.path.insert(0, ".")
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
logging.getLogger("witcert.selftest").setLevel(logging.INFO)
from bench.tightness_gpu import main  # noqa: E402

sys.exit(main())
