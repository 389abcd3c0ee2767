"""alma-health's ota_cert check: the board says when its OTA certificate expires (WARNING under
the horizon alma build warns at, CRITICAL once expired), read with the stdlib alone."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
from almaboard import x509
from almaboard.nagios import CRITICAL, OK, UNKNOWN, WARNING
from support_guard import ALMA_HEALTH, FakeBoard
from support_update import make_cert


def _install(board: FakeBoard, pem: bytes) -> None:
    (board.root / "etc/alma").mkdir(parents=True, exist_ok=True)
    (board.root / "etc/alma/ota-cert.pem").write_bytes(pem)
    (board.root / "etc/alma/ota.json").write_text(json.dumps({"machine": "m", "cert": "/etc/alma/ota-cert.pem"}))


def _check(board: FakeBoard) -> dict[str, object]:
    r = subprocess.run([sys.executable, str(ALMA_HEALTH), "--root", str(board.root), "--check", "ota_cert", "--json",
                        "--no-save"], capture_output=True, text=True, timeout=60)  # fmt: skip
    (check,) = json.loads(r.stdout)["checks"]
    return check  # type: ignore[no-any-return]


def _end(pem: bytes) -> datetime.datetime:
    from cryptography import x509 as cx

    return cx.load_pem_x509_certificate(pem).not_valid_after_utc


@pytest.mark.parametrize(
    ("days", "since", "status", "words"),
    [
        (365, 1, OK, "valid until"),
        (11, 1, WARNING, "expires on"),  # ten days left, under the 90-day horizon
        (30, 40, CRITICAL, "expired on"),  # expired ten days ago
    ],
)
def test_the_board_reports_its_ota_certificates_expiry(
    board: FakeBoard, tmp_path: Path, days: float, since: float, status: str, words: str
) -> None:
    pem, _ = make_cert(tmp_path / "c", days=days, since_days=since)
    _install(board, pem)
    check = _check(board)
    assert check["status"] == status, check
    assert words in str(check["summary"]) and f"{_end(pem):%Y-%m-%d}" in str(check["summary"]), check
    (perf,) = check["perfdata"]  # type: ignore[misc]
    assert perf["label"] == "ota_cert_days_left" and abs(perf["value"] - (days - since)) < 1, perf


def test_no_ota_feature_is_ok_and_a_missing_or_garbled_certificate_is_not(board: FakeBoard) -> None:
    assert _check(board)["status"] == OK
    (board.root / "etc/alma").mkdir(parents=True, exist_ok=True)
    (board.root / "etc/alma/ota.json").write_text(json.dumps({"cert": "/etc/alma/ota-cert.pem"}))
    assert _check(board)["status"] == CRITICAL  # the board can verify no update at all
    (board.root / "etc/alma/ota-cert.pem").write_bytes(
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    assert _check(board)["status"] == UNKNOWN


@pytest.mark.parametrize("end_year", [2049, 2050, 2120])  # UTCTime up to 2049, GeneralizedTime from 2050
def test_the_stdlib_reader_agrees_with_cryptography(tmp_path: Path, end_year: int) -> None:
    from cryptography import x509 as cx
    from cryptography.hazmat.primitives import serialization

    days = (datetime.datetime(end_year, 6, 1, tzinfo=datetime.UTC) - datetime.datetime.now(datetime.UTC)).days
    pem, _ = make_cert(tmp_path / str(end_year), days=days + 1, since_days=1)
    cert = cx.load_pem_x509_certificate(pem)
    for data in (pem, cert.public_bytes(serialization.Encoding.DER)):
        assert x509.validity(data) == (cert.not_valid_before_utc, cert.not_valid_after_utc)


@pytest.mark.parametrize("cut", [1, 10, 100, 300])
def test_a_truncated_certificate_is_an_error_not_a_crash(tmp_path: Path, cut: int) -> None:
    from cryptography import x509 as cx
    from cryptography.hazmat.primitives import serialization

    pem, _ = make_cert(tmp_path)
    der = cx.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    with pytest.raises(ValueError):
        x509.validity(der[:cut])


def test_the_horizon_is_the_one_alma_build_warns_at() -> None:
    from alma.imagebuild import ota

    assert ota.CERT_WARN_DAYS == x509.CERT_WARN_DAYS
