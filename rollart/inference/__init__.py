"""rollart.inference (see DESIGN.md §4)."""
