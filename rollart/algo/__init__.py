"""rollart.algo (see DESIGN.md §4)."""
