"""An X.509 certificate's validity (notBefore, notAfter), read with the stdlib alone.

The board shows when its OTA certificate expires (alma-health, check ``ota_cert``): once it
has, SWUpdate refuses every ``.swu``, including the one that would ship its successor. The
image ships no ``openssl`` command for this, so the DER is walked here, only as far as
``tbsCertificate.validity`` (RFC 5280 §4.1): every length is checked against what is left,
anything unexpected is ``ValueError``. ``CERT_WARN_DAYS`` is the one horizon: ``alma build``
warns under it, the board's health turns WARNING under it.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime

CERT_WARN_DAYS = 90
MAX_CERT = 64 * 1024
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]+?)-----END CERTIFICATE-----")
_SEQUENCE, _UTCTIME, _GENTIME, _VERSION = 0x30, 0x17, 0x18, 0xA0


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at ``pos``."""
    if pos + 2 > len(data):
        raise ValueError("truncated DER")
    tag, first = data[pos], data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        n = first & 0x7F
        if n == 0 or n > 4 or pos + n > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos : pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise ValueError("DER element longer than its container")
    return tag, pos, pos + length


def _time(tag: int, raw: bytes) -> datetime:
    text = raw.decode("ascii")
    if tag == _UTCTIME and re.fullmatch(r"\d{12}Z", text):
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"  # RFC 5280 4.1.2.5.1
    elif not (tag == _GENTIME and re.fullmatch(r"\d{14}Z", text)):
        raise ValueError(f"not a UTCTime/GeneralizedTime: {text[:20]!r}")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)


def validity(data: bytes) -> tuple[datetime, datetime]:
    """(notBefore, notAfter) of the first certificate in ``data`` (PEM or DER)."""
    if len(data) > MAX_CERT:
        raise ValueError(f"larger than {MAX_CERT} bytes")
    m = _PEM.search(data)
    if m:
        try:
            data = base64.b64decode(b"".join(m.group(1).split()), validate=True)
        except binascii.Error:
            raise ValueError("PEM body is not base64") from None
    tag, start, _ = _tlv(data, 0)  # Certificate
    if tag != _SEQUENCE:
        raise ValueError("not a DER certificate")
    tag, pos, tbs_end = _tlv(data, start)  # tbsCertificate
    if tag != _SEQUENCE:
        raise ValueError("no tbsCertificate")
    tag, _, end = _tlv(data, pos)
    if tag == _VERSION:  # [0] EXPLICIT version, optional
        pos = end
    for _field in ("serialNumber", "signature", "issuer"):
        _, _, pos = _tlv(data, pos)
    tag, pos, v_end = _tlv(data, pos)  # validity
    if tag != _SEQUENCE or v_end > tbs_end:
        raise ValueError("no validity in tbsCertificate")
    t1, s1, e1 = _tlv(data, pos)
    t2, s2, e2 = _tlv(data, e1)
    if e2 > v_end:
        raise ValueError("validity overruns its sequence")
    return _time(t1, data[s1:e1]), _time(t2, data[s2:e2])
