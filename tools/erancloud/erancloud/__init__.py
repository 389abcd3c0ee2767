"""ERANCLOUD: Local-SGD (DiLoCo-style) training in borrowed cycles, over NATS JetStream."""

__version__ = "0.1.0"
PROTOCOL = 1  # the "v" field of every message, record and blob header
