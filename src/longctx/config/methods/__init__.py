"""Position-method specs, one module per method (registry.py says what a spec is)."""
