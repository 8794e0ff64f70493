"""rollart.control (see DESIGN.md §4)."""
