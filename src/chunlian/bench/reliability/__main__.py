"""``python -m chunlian.bench.reliability``: the long run (``report.main``)."""

from __future__ import annotations

import sys

from chunlian.bench.reliability.report import main

if __name__ == "__main__":
    sys.exit(main())
