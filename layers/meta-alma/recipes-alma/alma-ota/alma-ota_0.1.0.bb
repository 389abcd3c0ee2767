SUMMARY = "ALMA-OS A/B update agent: the board side of alma update"
DESCRIPTION = "alma-ota installs a signed .swu into the inactive rootfs slot with SWUpdate, \
               switches the boot slot only after a verified read-back, arms the bootloader \
               capsule only when it differs and is not a downgrade, and commits or rolls \
               back when the host says so (docs/ota.md)."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "utils"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ccfa3f03eeb8180970a4e900f7ddc92"
CVE_PRODUCT = ""

# The on-board code is single-sourced from the repository's tools/ota (never copied into
# the layer); ALMA_TOOLS_DIR is set from LAYERDIR in conf/layer.conf. The signing
# certificate (ALMA_OTA_CERT) and the optional hawkBit client config (ALMA_OTA_SWUPDATE_CFG)
# are absolute paths `alma build` checked and wrote (src/alma/imagebuild/ota.py).
# nooelint: oelint.vars.bbvars.FILESPATH - a recipe-local search path is how one recipe fetches the shared tree
FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"
SRC_URI = "file://ota"
SRC_URI += "${@'file://' + d.getVar('ALMA_OTA_CERT') if d.getVar('ALMA_OTA_CERT') else ''}"
SRC_URI += "${@'file://' + d.getVar('ALMA_OTA_SWUPDATE_CFG') if d.getVar('ALMA_OTA_SWUPDATE_CFG') else ''}"
S = "${WORKDIR}/ota"

# tools/ota/pyproject.toml: a PEP 517 build (setuptools) of the almaota package.
inherit python_setuptools_build_meta systemd

# The board settles its own update at every boot and from a timer (alma-ota settle).
# The board's identity (hostname, ssh host keys, flash-time admin keys) kept on /data at
# every boot, so an update's new slot is the same board (alma-identity, docs/ota.md).
SYSTEMD_SERVICE:${PN} = "alma-ota-settle.service alma-ota-settle.timer alma-identity.service"

# ota.json names this MACHINE (swupdate -H): one package per machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

# The agent's configuration: machine and hardware revision (swupdate -H), the certificate,
# the persistent state dir (lock and pending update survive the slot switch), the lowest
# bootloader version a capsule may carry.
do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/alma-ota-settle.service ${D}${systemd_system_unitdir}/alma-ota-settle.service
    install -m 0644 ${S}/systemd/alma-ota-settle.timer ${D}${systemd_system_unitdir}/alma-ota-settle.timer
    install -m 0644 ${S}/systemd/alma-identity.service ${D}${systemd_system_unitdir}/alma-identity.service
    install -d ${D}${sysconfdir}/ssh/sshd_config.d
    install -m 0644 ${S}/ssh/00-alma-identity.conf ${D}${sysconfdir}/ssh/sshd_config.d/00-alma-identity.conf
    # tegra-redundant-boot's nv_update_verifier.service runs "nvbootctrl verify" at every boot,
    # marking the booted slot good before the health gate judged it: masked (as
    # meta-mender-tegra's redundant-boot-overrides does); alma-ota commit owns "mark good".
    install -d ${D}${sysconfdir}/systemd/system
    ln -sf /dev/null ${D}${sysconfdir}/systemd/system/nv_update_verifier.service
    install -d ${D}${sysconfdir}/alma
    if [ -n "${ALMA_OTA_CERT}" ]; then
        install -m 0644 ${ALMA_OTA_CERT} ${D}${sysconfdir}/alma/ota-cert.pem
    fi
    # The SWUpdate daemon's per-board words (certificate, machine, inactive slot, device id),
    # sourced by meta-swupdate's launcher swupdate.sh: the hawkBit path (docs/ota.md).
    install -d ${D}${sysconfdir}/swupdate/conf.d
    install -m 0644 ${S}/swupdate/50-alma-ota ${D}${sysconfdir}/swupdate/conf.d/50-alma-ota
    if [ -n "${ALMA_OTA_SWUPDATE_CFG}" ]; then
        install -m 0644 ${ALMA_OTA_SWUPDATE_CFG} ${D}${sysconfdir}/swupdate.cfg
    fi
    printf '{"machine": "%s", "hw_revision": "1.0", "cert": "%s", "state_dir": "%s", "lowest_bootloader": "%s"}\n' \
        "${MACHINE}" "${sysconfdir}/alma/ota-cert.pem" "${ALMA_OTA_STATE_DIR}" "${ALMA_OTA_LOWEST_BOOTLOADER}" \
        > ${D}${sysconfdir}/alma/ota.json
}

ALMA_OTA_STATE_DIR ??= "/data/alma-ota"

FILES:${PN} += "${sysconfdir}/alma/ota.json ${sysconfdir}/alma/ota-cert.pem ${sysconfdir}/swupdate.cfg \
                ${sysconfdir}/swupdate/conf.d/50-alma-ota \
                ${sysconfdir}/systemd/system/nv_update_verifier.service ${systemd_system_unitdir}/alma-ota-settle.* \
                ${systemd_system_unitdir}/alma-identity.service ${sysconfdir}/ssh/sshd_config.d/00-alma-identity.conf"
CONFFILES:${PN} = "${sysconfdir}/alma/ota.json"
# The slot tools must be in the image ("could not identify current boot slot" otherwise):
# nvbootctrl (tegra-redundant-boot-base), tegra-redundant-boot (its verifier masked above),
# oe4t-set-uefi-OSIndications (setup-nv-boot-control), the capsules (tegra-uefi-capsules).
RDEPENDS:${PN} = "openssh-keygen python3-almaboard python3-core python3-json setup-nv-boot-control swupdate \
                  tegra-redundant-boot tegra-redundant-boot-base tegra-uefi-capsules"
# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
