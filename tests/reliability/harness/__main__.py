"""``python -m tests.reliability.harness``: the long run (``report.main``)."""

from __future__ import annotations

import sys

from tests.reliability.harness.report import main

if __name__ == "__main__":
    sys.exit(main())
