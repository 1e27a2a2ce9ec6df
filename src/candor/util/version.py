"""candor's version: one home, read by the package metadata and stamped into every provenance."""

__version__ = "0.1.0"
