"""rollart.observability (see DESIGN.md §4)."""
