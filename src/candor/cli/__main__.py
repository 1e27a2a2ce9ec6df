"""``python -m candor.cli``: the console script (``accelerate launch -m candor.cli train …`` uses it)."""

from candor.cli.commands import run

if __name__ == "__main__":
    run()
