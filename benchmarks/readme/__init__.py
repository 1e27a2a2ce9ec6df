"""The READMEs' generated tables and quoted numbers (``python -m benchmarks.readme_tables``).

``generator`` finds the markers and rewrites or checks both READMEs; ``sections`` is the registry of
renderers; the other modules hold the renderers by topic and ``formatting`` the cells they share.
"""
