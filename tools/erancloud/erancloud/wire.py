"""The blobs that travel through the Object Store, and the checks every one passes on the way in.

A blob is ``MAGIC`` + a 4-byte little-endian header length + a JSON header + a payload:

* ``model`` / ``momentum`` / ``delta``: ``count`` float32 values (little-endian), the
  parameter vector in ``model.MLP`` order;
* ``shard``: ``rows`` × ``features`` uint8 pixel values, then ``rows`` uint8 labels.

Decoding never trusts the header: sizes are bounded before anything is allocated, the
payload length must match the header exactly, floats must be finite and every value must be
in range. A blob that fails any check raises ``BadBlob`` with the reason.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import numpy as np

from . import PROTOCOL
from .errors import BadBlob

MAGIC = b"ERC1"
HEADER_MAX = 4096
BLOB_MAX = 64 * 1024 * 1024  # far above the digits model (10 kB) and its shards (~30 kB)
KINDS = ("model", "momentum", "delta", "shard")


def sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _pack(header: dict[str, Any], payload: bytes) -> bytes:
    head = json.dumps({"v": PROTOCOL, **header}, sort_keys=True, separators=(",", ":")).encode()
    if len(head) > HEADER_MAX:
        raise ValueError("blob header too large")
    return MAGIC + struct.pack("<I", len(head)) + head + payload


def _unpack(blob: bytes, kind: str) -> tuple[dict[str, Any], bytes]:
    if not isinstance(blob, bytes | bytearray) or len(blob) < 8:
        raise BadBlob("too short to be a blob")
    if len(blob) > BLOB_MAX:
        raise BadBlob(f"{len(blob)} bytes, over the {BLOB_MAX}-byte limit")
    if blob[:4] != MAGIC:
        raise BadBlob("not an ERANCLOUD blob (bad magic)")
    (hlen,) = struct.unpack("<I", blob[4:8])
    if hlen > HEADER_MAX or 8 + hlen > len(blob):
        raise BadBlob("header length out of range")
    try:
        header = json.loads(bytes(blob[8 : 8 + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadBlob(f"unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise BadBlob("header is not a JSON object")
    if header.get("v") != PROTOCOL:
        raise BadBlob(f"protocol version {header.get('v')!r}, expected {PROTOCOL}")
    if header.get("kind") != kind:
        raise BadBlob(f"a {header.get('kind')!r} blob where a {kind!r} was expected")
    return header, bytes(blob[8 + hlen :])


def _int_field(header: dict[str, Any], name: str, low: int, high: int) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadBlob(f"header field {name!r} = {value!r} is not an integer in [{low}, {high}]")
    return value


def vector_max_bytes(count: int) -> int:
    """The largest blob a vector of ``count`` floats can be: refuse bigger ones unread."""
    return 8 + HEADER_MAX + 4 * count


def encode_vector(kind: str, vec: np.ndarray, **meta: Any) -> bytes:
    data = np.ascontiguousarray(vec, dtype="<f4")
    return _pack({"kind": kind, "count": int(data.size), **meta}, data.tobytes())


def decode_vector(blob: bytes, kind: str, count: int) -> tuple[np.ndarray, dict[str, Any]]:
    """A float32 vector of exactly ``count`` finite values, and its header."""
    header, payload = _unpack(blob, kind)
    n = _int_field(header, "count", 0, BLOB_MAX // 4)
    if n != count:
        raise BadBlob(f"{n} values where the model has {count}")
    if len(payload) != 4 * n:
        raise BadBlob(f"payload is {len(payload)} bytes, header says {4 * n}")
    vec = np.frombuffer(payload, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(vec)):
        raise BadBlob("non-finite values (NaN or infinity)")
    return vec, header


def encode_shard(x: np.ndarray, y: np.ndarray, classes: int, **meta: Any) -> bytes:
    """``x``: rows × features integer pixel values 0..16; ``y``: labels 0..classes-1."""
    xs = np.ascontiguousarray(x, dtype=np.uint8)
    ys = np.ascontiguousarray(y, dtype=np.uint8)
    rows, features = xs.shape
    header = {"kind": "shard", "rows": rows, "features": features, "classes": classes, **meta}
    return _pack(header, xs.tobytes() + ys.tobytes())


def decode_shard(blob: bytes, features: int, classes: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    header, payload = _unpack(blob, "shard")
    rows = _int_field(header, "rows", 1, 10_000_000)
    if _int_field(header, "features", 1, 1 << 16) != features:
        raise BadBlob(f"shard has {header['features']} features, the model {features}")
    if _int_field(header, "classes", 2, 255) != classes:
        raise BadBlob(f"shard has {header['classes']} classes, the model {classes}")
    if len(payload) != rows * (features + 1):
        raise BadBlob(f"payload is {len(payload)} bytes, header says {rows * (features + 1)}")
    raw = np.frombuffer(payload, dtype=np.uint8)
    x, y = raw[: rows * features].reshape(rows, features), raw[rows * features :]
    if int(x.max()) > 16:
        raise BadBlob("pixel value above 16")
    if int(y.max()) >= classes:
        raise BadBlob(f"label {int(y.max())} out of range")
    return x.astype(np.float32) / 16.0, y.astype(np.int64), header
