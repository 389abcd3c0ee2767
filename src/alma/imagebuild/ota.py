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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma.errors import ConfigError


class MissingOtaCert(ConfigError):
    """A release with the ota feature and no signing certificate: one of the plan's problems
    (listed with every other preflight problem, like a missing admin key), not an early stop."""

FEATURE = "ota"
_URL = re.compile(r"^https?://[A-Za-z0-9.-]{1,253}(:\d{1,5})?(/[A-Za-z0-9._~/-]*)?$")
_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CFG_NAME = "alma-swupdate.cfg"


@dataclass
class OtaSettings:
    cert: Path | None
    hawkbit_url: str | None = None
    tenant: str = "DEFAULT"
    poll_s: int = 300

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


def resolve(*, features: tuple[str, ...], release: bool, cli_cert: Path | None, root: Path,
            config: dict[str, Any]) -> OtaSettings | None:  # fmt: skip
    """None without the feature; else the settings (ConfigError, exit 2, with the fix)."""
    if FEATURE not in features:
        if cli_cert is not None:
            raise ConfigError("--ota-key needs the ota feature", hint="alma build --feature ota --ota-key CERT.pem")
        return None
    t = _table(config)
    cert: Path | None = cli_cert
    if cert is None and isinstance(t.get("signing_cert"), str):
        p = Path(t["signing_cert"]).expanduser()
        cert = p if p.is_absolute() else root / p
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
    return OtaSettings(cert=check_cert(cert) if cert is not None else None, hawkbit_url=url, tenant=tenant,
                       poll_s=poll)  # fmt: skip


def suricatta_config(s: OtaSettings) -> str:
    """SWUpdate's config file (libconfig) with the suricatta (hawkBit DDI) section.

    The device id is not here: each board passes its own (``-u "-i <hostname>"``) at start.
    """
    assert s.hawkbit_url is not None
    return (
        "# Generated by alma build (feature ota, [ota] hawkbit_url): docs/ota.md\n"
        "globals :\n{\n"
        "\tverbose = true;\n"
        "\tloglevel = 5;\n"
        "};\n"
        "suricatta :\n{\n"
        f'\turl = "{s.hawkbit_url}";\n'
        f'\ttenant = "{s.tenant}";\n'
        f"\tpolldelay = {s.poll_s};\n"
        "\tretry = 5;\n"
        "\tretrywait = 30;\n"
        "};\n"
    )
