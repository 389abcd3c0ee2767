"""The image's OTA trust anchor and hawkBit client config (feature ``ota``, docs/ota.md).

A board with the ``ota`` feature installs only ``.swu`` files whose ``sw-description`` is
signed by the certificate baked in at build time. So, like the admin key, it is decided
offline before anything runs:

  1. ``alma build --ota-key CERT.pem``
  2. ``alma.toml``: ``[ota] signing_cert = "keys/ota.pem"`` (relative to the checkout)

A release build with ``ota`` and no certificate is refused (exit 2): its boards would accept
no update at all, or (worse, had we a default) anyone's. The file must hold exactly one X.509
certificate and no private key (a key in the image would let every board sign updates).

``[ota] hawkbit_url`` (+ ``hawkbit_tenant``, ``hawkbit_poll_s``) bakes SWUpdate's suricatta
section in (``swupdate.cfg``, rendered here, installed by recipes-alma/alma-ota): the boards
then poll that Eclipse hawkBit server (the fleet-scale path) instead of waiting for
``alma update``. The URL must match ``_URL`` before it reaches a config file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from almaboard import x509

from alma.errors import ConfigError


class MissingOtaCert(ConfigError):
    """A release with the ota feature and no signing certificate: one of the plan's problems
    (listed with every other preflight problem, like a missing admin key), not an early stop."""


FEATURE = "ota"
# Warn when the baked-in certificate expires within this many days: once it has expired,
# SWUpdate refuses every .swu, including the one that would ship its successor (docs/ota.md).
CERT_WARN_DAYS = x509.CERT_WARN_DAYS  # one horizon: the board's health warns under it too
_URL = re.compile(r"^https?://[A-Za-z0-9.-]{1,253}(:\d{1,5})?(/[A-Za-z0-9._~/-]*)?$")
_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CFG_NAME = "alma-swupdate.cfg"


@dataclass
class OtaSettings:
    cert: Path | None
    hawkbit_url: str | None = None
    tenant: str = "DEFAULT"
    poll_s: int = 300
    notes: list[str] = field(default_factory=list)

    def conf_lines(self, cfg_path: Path | None) -> list[str]:
        lines = ["# feature ota: the .swu signing certificate baked into the image (docs/ota.md)"]
        if self.cert is not None:
            lines.append(f'ALMA_OTA_CERT = "{self.cert}"')
        if cfg_path is not None:
            lines.append(f'ALMA_OTA_SWUPDATE_CFG = "{cfg_path}"')
        return lines


def _table(config: dict[str, Any]) -> dict[str, Any]:
    t = config.get("ota", {})
    if not isinstance(t, dict):
        raise ConfigError("alma.toml: [ota] must be a table", hint='[ota]\nsigning_cert = "keys/ota.pem"')
    unknown = sorted(set(t) - {"signing_cert", "hawkbit_url", "hawkbit_tenant", "hawkbit_poll_s"})
    if unknown:
        raise ConfigError(f"alma.toml: [ota] unknown key(s): {', '.join(unknown)}")
    return t


def configured_cert(root: Path, config: dict[str, Any]) -> Path | None:
    """``[ota] signing_cert`` of alma.toml (relative to the checkout), the fleet's certificate:
    baked into images by ``alma build``, checked against by ``alma verify`` and ``alma update``."""
    v = _table(config).get("signing_cert")
    if not isinstance(v, str):
        return None
    p = Path(v).expanduser()
    return p if p.is_absolute() else root / p


def check_cert(path: Path) -> Path:
    """``path`` holds one PEM certificate and nothing secret; returns it absolute."""
    from cryptography import x509

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"--ota-key {path}: {exc.strerror}", hint="pass the PEM certificate of the OTA signer"
        ) from None
    if b"PRIVATE KEY" in data:
        raise ConfigError(
            f"{path} contains a private key: it must never go into an image",
            hint="pass only the certificate (openssl x509 -in signer.pem -out ota-cert.pem)",
        )
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if len(certs) != 1:
        raise ConfigError(f"{path} is not one PEM X.509 certificate", hint="openssl x509 -in FILE -noout -text")
    return path.resolve()


def cert_lifetime(path: Path, now: datetime | None = None) -> str | None:
    """ConfigError for a certificate that has expired or is not valid yet (boards would refuse
    every .swu); a warning naming the date when it expires within CERT_WARN_DAYS; else None."""
    from cryptography import x509

    from alma.ground import utc_now

    cert = x509.load_pem_x509_certificate(path.read_bytes())
    now = now or utc_now()
    end, start = cert.not_valid_after_utc, cert.not_valid_before_utc
    rotate = "make a new signing certificate and ship it with an update signed by the current one (docs/ota.md)"
    if end <= now:
        raise ConfigError(
            f"the OTA signing certificate {path} expired on {end:%Y-%m-%d}: boards with it would refuse every .swu",
            hint=rotate,
        )
    if start > now:
        raise ConfigError(
            f"the OTA signing certificate {path} is not valid before {start:%Y-%m-%d %H:%M} UTC",
            hint="check this host's clock, or the certificate's dates (openssl x509 -noout -dates)",
        )
    if end - now < timedelta(days=CERT_WARN_DAYS):
        return (
            f"warning: the OTA signing certificate {path} expires on {end:%Y-%m-%d} (in {(end - now).days} days, "
            f"under {CERT_WARN_DAYS}): {rotate}"
        )
    return None


def resolve(*, features: tuple[str, ...], release: bool, cli_cert: Path | None, root: Path,
            config: dict[str, Any]) -> OtaSettings | None:  # fmt: skip
    """None without the feature; else the settings (ConfigError, exit 2, with the fix)."""
    if FEATURE not in features:
        if cli_cert is not None:
            raise ConfigError("--ota-key needs the ota feature", hint="alma build --feature ota --ota-key CERT.pem")
        return None
    t = _table(config)
    cert: Path | None = cli_cert or configured_cert(root, config)
    if cert is None and release:
        raise MissingOtaCert(
            "a release image with the ota feature needs the OTA signing certificate: without it the "
            "boards would accept no signed update",
            hint='alma build --feature ota --ota-key ota-cert.pem, or [ota] signing_cert = "keys/ota.pem" in alma.toml',
        )
    url = t.get("hawkbit_url")
    if url is not None and (not isinstance(url, str) or not _URL.fullmatch(url)):
        raise ConfigError(f"alma.toml: [ota] hawkbit_url {str(url)[:80]!r} is not an http(s)://host[:port] URL")
    tenant = t.get("hawkbit_tenant", "DEFAULT")
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise ConfigError("alma.toml: [ota] hawkbit_tenant must be letters, digits, - or _ (at most 64)")
    poll = t.get("hawkbit_poll_s", 300)
    if isinstance(poll, bool) or not isinstance(poll, int) or not 10 <= poll <= 86400:
        raise ConfigError("alma.toml: [ota] hawkbit_poll_s must be seconds between 10 and 86400")
    checked = check_cert(cert) if cert is not None else None
    note = cert_lifetime(checked) if checked is not None else None
    return OtaSettings(cert=checked, hawkbit_url=url, tenant=tenant, poll_s=poll, notes=[note] if note else [])


def suricatta_config(s: OtaSettings) -> str:
    """SWUpdate's config file (libconfig) with the suricatta (hawkBit DDI) section.

    What is per board is not here: the launcher (meta-swupdate's swupdate.sh) sources
    alma-ota's /etc/swupdate/conf.d/50-alma-ota, which adds the certificate, machine, inactive
    slot, the copy of the .swu for the agent (``-o``) and the device id (``-u "-i <hostname>"``)
    from ``alma-ota swupdate-args``. The hooks hand each install to the board's agent: before
    any image is written it takes the board's lease (``claim``: refused while an ``alma
    update`` run holds it), after a successful install it switches and reboots (``adopt``);
    the board then judges the new slot itself (``alma-ota settle``, docs/ota.md).
    """
    assert s.hawkbit_url is not None
    return (
        "# Generated by alma build (feature ota, [ota] hawkbit_url): docs/ota.md\n"
        "globals :\n{\n"
        "\tverbose = true;\n"
        "\tloglevel = 5;\n"
        '\tpreupdatecmd = "alma-ota claim";\n'
        '\tpostupdatecmd = "alma-ota adopt";\n'
        "};\n"
        "suricatta :\n{\n"
        f'\turl = "{s.hawkbit_url}";\n'
        f'\ttenant = "{s.tenant}";\n'
        f"\tpolldelay = {s.poll_s};\n"
        "\tretry = 5;\n"
        "\tretrywait = 30;\n"
        "};\n"
    )
