"""``parsearch probe``: measure the allocation (GEMMs, collectives, memory baseline) into a
machine profile the estimate uses instead of its data-sheet constants."""
