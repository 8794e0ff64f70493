"""The driver: wires the planes and runs the six-step loop of DESIGN.md §2 (lands with the control-plane issue)."""
