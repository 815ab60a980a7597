"""``python -m chunlian.api``: serve with settings from the ``CHUNLIAN_*`` environment."""

from __future__ import annotations

import sys

from chunlian.api import serve
from chunlian.config import load_settings
from chunlian.errors import ConfigError


def main() -> int:
    """Load settings, serve; a bad setting exits 2 with the reason."""
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"chunlian: {e}", file=sys.stderr)
        return 2
    serve(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
