"""longctx_replication: our own replication of STRING's findings, kept apart from the library.

The miniature (`make replicate`, CPU) and its one-GPU twin (`make replicate-twin`) are one
study; this package holds what serves only it: the seed-level verdict rules, the report and
its figures, the mechanism screens, the twin's plan, tuning rule, side-by-side runner and
seed archives, and the Debian-manuals corpus of the twin. What fits the twin to a rented
machine (its driver, the call budget, the max_steps cuts, the archive's size limit) is the
lab's, in tools/twin/ (tools/README.md).

It imports `longctx`; `longctx` never imports it (tests/test_layers.py), and it imports
nothing of tools/ (tests/test_layers_tools.py). README.md beside
this file states the rules; docs/replication.md holds the results.
"""
