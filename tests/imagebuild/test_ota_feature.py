"""Feature ota on the build side: the signing certificate decided offline (a release
without one is refused like a missing admin key), never a private key, and the hawkBit
client config the image gets (the REAL SWUpdate reading it with the image's other files:
tests/update/test_hawkbit.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support_build import mark_checked_out, read_record
from support_update import make_cert


@pytest.fixture(autouse=True)
def _ready(project: Path, fakes: Path, probes) -> None:  # type: ignore[no-untyped-def]
    mark_checked_out(project)
    (project / "kas/features/ota.yml").write_text(
        'header:\n  version: 14\nlocal_conf_header:\n  alma-55-ota: |\n    ALMA_OTA = "1"\n'
    )


def _conf(out: str) -> str:
    return "\n".join(ln.split("| ", 1)[1] for ln in out.splitlines() if ln.startswith("  | "))


@pytest.fixture
def cert(tmp_path: Path) -> Path:
    pem, key = make_cert(tmp_path / "ota")
    (tmp_path / "ota-cert.pem").write_bytes(pem)
    (tmp_path / "ota-signer.pem").write_bytes(pem + key)
    return tmp_path / "ota-cert.pem"


def test_release_with_ota_and_no_cert_is_refused_before_anything_runs(project, fakes, alma):  # type: ignore[no-untyped-def]
    code, _, err = alma("build", "--feature", "ota")
    assert code == 2
    assert "needs the OTA signing certificate" in err and "--ota-key" in err
    # --dry-run still shows the plan, with the missing certificate among its problems
    code, out, err = alma("build", "--dry-run", "--feature", "ota")
    assert code == 2, err
    assert "needs the OTA signing certificate" in out + err and "--ota-key" in out + err
    assert read_record(fakes) == []


def test_the_cert_reaches_bitbake_and_a_private_key_never_does(project, alma, cert: Path):  # type: ignore[no-untyped-def]
    code, out, err = alma("build", "--dry-run", "--feature", "ota", "--ota-key", str(cert))
    assert code == 0, err
    assert f'ALMA_OTA_CERT = "{cert.resolve()}"' in _conf(out)
    code, out, err = alma("build", "--dry-run", "--feature", "ota", "--ota-key", str(cert.with_name("ota-signer.pem")))
    assert code == 2 and "contains a private key" in err and "PRIVATE" not in out


def test_alma_shell_takes_the_cert_as_alma_build_does(project, fakes, alma, cert: Path):  # type: ignore[no-untyped-def]
    """The shell is the build's configuration: the fix the preflight prints works in both."""
    code, _, err = alma("shell", "--feature", "ota", "-c", "true")
    assert code == 2 and "--ota-key" in err and read_record(fakes) == []
    code, _, err = alma("shell", "--feature", "ota", "--ota-key", str(cert), "-c", "true")
    assert code == 0, err
    conf = next((project / "build").glob("*/alma-build.conf")).read_text()
    assert f'ALMA_OTA_CERT = "{cert.resolve()}"' in conf


def test_an_expired_certificate_is_refused_and_one_close_to_expiry_warns_with_its_date(  # type: ignore[no-untyped-def]
    project, alma, tmp_path: Path
):
    """Once the baked-in certificate expires SWUpdate refuses every .swu, the rotating one too."""
    old, _ = make_cert(tmp_path / "old", days=30, since_days=40)  # expired ten days ago
    (tmp_path / "old.pem").write_bytes(old)
    code, out, err = alma("build", "--dry-run", "--feature", "ota", "--ota-key", str(tmp_path / "old.pem"))
    assert code == 2 and "expired on " in err and "refuse every .swu" in err, out + err
    soon, _ = make_cert(tmp_path / "soon", days=11, since_days=1)  # ten days left
    (tmp_path / "soon.pem").write_bytes(soon)
    code, out, err = alma("build", "--dry-run", "--feature", "ota", "--ota-key", str(tmp_path / "soon.pem"))
    from cryptography import x509

    end = x509.load_pem_x509_certificate(soon).not_valid_after_utc
    assert code == 0, err
    assert f"expires on {end:%Y-%m-%d}" in out and "warning:" in out and "under 90" in out, out


def test_ota_key_without_the_feature_is_a_usage_error(project, alma, cert: Path):  # type: ignore[no-untyped-def]
    code, _, err = alma("build", "--dry-run", "--ota-key", str(cert))
    assert code == 2 and "--ota-key needs the ota feature" in err


@pytest.mark.parametrize("url", ['http://x";\nglobals', "file:///etc/passwd", "http://h:1/a b", "ftp://h"])
def test_hawkbit_url_must_match_its_grammar(project, alma, cert: Path, url: str):  # type: ignore[no-untyped-def]
    (project / "alma.toml").write_text(f"[ota]\nhawkbit_url = {json.dumps(url)}\n")  # a TOML basic string
    code, _, err = alma("build", "--dry-run", "--feature", "ota", "--ota-key", str(cert))
    assert code == 2 and "is not an http(s)://host[:port] URL" in err, err


def test_hawkbit_url_bakes_the_suricatta_config_in(project, alma, cert: Path):  # type: ignore[no-untyped-def]
    (project / "alma.toml").write_text('[ota]\nhawkbit_url = "https://hawkbit.lab:8443"\nhawkbit_tenant = "lab"\n')
    code, out, err = alma("build", "--dry-run", "--feature", "ota", "--ota-key", str(cert))
    assert code == 0, err
    line = next(ln for ln in _conf(out).splitlines() if ln.startswith("ALMA_OTA_SWUPDATE_CFG"))
    cfg = Path(line.split('"')[1])
    text = cfg.read_text()
    assert 'url = "https://hawkbit.lab:8443";' in text and 'tenant = "lab";' in text
