"""rollart.bench (see DESIGN.md §4)."""
