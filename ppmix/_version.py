"""The installed ppmix version (kept apart so that low layers can read it without importing the package)."""

__version__ = "0.1.0"
