"""chunlian: an open service that writes Spring Festival couplets (春联)."""

__version__ = "0.1.0"
