"""Honest answering: a generator, a confidence, and a threshold to abstain below (DESIGN.md §2 serve/)."""
