"""Probes of what training did to positions and context use (DESIGN §7)."""
