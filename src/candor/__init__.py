"""candor: make language models honest about what they know."""

__version__ = "0.1.0"
