"""The ``alma`` command line: one module per verb, each only parsing and printing."""
