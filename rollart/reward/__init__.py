"""rollart.reward (see DESIGN.md §4)."""
