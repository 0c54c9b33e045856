"""Probes of what training did to positions and context use (docs/design.md §7)."""
