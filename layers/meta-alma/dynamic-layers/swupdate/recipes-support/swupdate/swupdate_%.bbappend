# ALMA-OS feature ota: signed images only (files/alma-signed.cfg, a config fragment merged
# over meta-swupdate's defconfig). alma-ota runs `swupdate -i` itself, so the daemon stays
# off unless the image polls a hawkBit server ([ota] hawkbit_url: ALMA_OTA_SWUPDATE_CFG).
# Only for the alma distro (the :alma override).
FILESEXTRAPATHS:prepend:alma := "${THISDIR}/files:"
SRC_URI:append:alma = " file://alma-signed.cfg"
SYSTEMD_AUTO_ENABLE:${PN}:alma = "${@'enable' if d.getVar('ALMA_OTA_SWUPDATE_CFG') else 'disable'}"
