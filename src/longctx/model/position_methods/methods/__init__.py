"""The in-tree position methods, one builder module per method (registry.py)."""
