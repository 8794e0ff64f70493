"""rollart.envs (see DESIGN.md §4)."""
