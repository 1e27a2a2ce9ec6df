"""Adapters that let other frameworks read what ``candor serve`` answers (optional extras)."""
