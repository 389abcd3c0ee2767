"""ALMA-OS on-board guard: thermal guard, reset forensics, health watchdog, fabric network.

Stdlib only (the image stays lean and these start fast). Machine paths go through
:class:`almaguard.paths.Paths` so tests point them at a fake tree.
"""

__version__ = "0.1.0"
