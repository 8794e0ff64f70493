"""rollart.trainer (see DESIGN.md §4)."""
