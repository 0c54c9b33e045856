"""longctx_replication: our own replication of STRING's findings, kept apart from the library.

The miniature (`make replicate`, CPU) and its one-GPU twin (`make replicate-twin`) are one
study run on one kind of rented machine; this package holds what serves only them: the
seed-level verdict rules, the report and its figures, the mechanism screens, the twin's
side-by-side driver and plan, archives sized to what one device call may send back, a
GGUF split into transfer-sized parts, and the Debian-manuals corpus of the twin.

It imports `longctx`; `longctx` never imports it (tests/test_layers.py). README.md beside
this file states the rules; docs/replication.md holds the results.
"""
