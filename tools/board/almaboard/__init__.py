"""ALMA-OS board library: the one stdlib-only implementation the on-board programs share.

alma-guard, alma-health, alma-fabric and eran-grid import it; the host toolchain ships it
too (``almaboard.*``) so host and board never carry two versions of one rule.
"""

__version__ = "0.1.0"
