"""Scripts and styles of the labelling page (candor.annotation.labelling)."""
