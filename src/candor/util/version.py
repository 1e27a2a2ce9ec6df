"""candor's version: one home, read by the package metadata and stamped into every provenance."""

__version__ = "0.1.0"

# The distribution's name (``pip``'s); "candor" on PyPI is an unrelated project.
DISTRIBUTION = "candor-honesty"


def install_hint(extra: str) -> str:
    """How to add one optional extra, in a form that cannot install someone else's package."""
    return f"pip install -e '.[{extra}]' in candor's source folder (the {DISTRIBUTION} distribution)"
