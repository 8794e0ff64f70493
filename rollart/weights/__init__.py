"""rollart.weights (see DESIGN.md §4)."""
