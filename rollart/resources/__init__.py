"""rollart.resources (see DESIGN.md §4)."""
