"""ERAN-GRID: the opt-in idle-cycle agent (stdlib only; nats-py only for the NATS backend)."""

__version__ = "0.1.0"
