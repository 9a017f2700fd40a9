"""Quality evaluation on the embedded model (see ``witcert.quality``; same as ``witcert eval``).

    python bench/quality.py --lengths 1024,2048,4096 --seeds 5 --json bench/quality.json
"""

import sys

from witcert.quality import main

if __name__ == "__main__":
    sys.exit(main())
