"""Loaders and plots used by the analysis notebooks."""
