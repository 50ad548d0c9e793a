"""The package version, in a leaf module so any module may import it."""

__version__ = "0.1.0"
