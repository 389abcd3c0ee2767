SUMMARY = "ALMA-OS watchdog policy and masked platform-stalling services"
DESCRIPTION = "A systemd system.conf.d drop-in arming the hardware watchdog \
               (RuntimeWatchdogSec, RebootWatchdogSec) and masks for the services listed \
               in ALMA_MASKED_SERVICES, which are known to stall the platform."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "utils"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ccfa3f03eeb8180970a4e900f7ddc92"
CVE_PRODUCT = ""

# The on-board code is single-sourced from the repository's tools/guard (never copied into
# the layer); ALMA_TOOLS_DIR is set from LAYERDIR in conf/layer.conf.
# nooelint: oelint.vars.bbvars.FILESPATH - a recipe-local search path is how one recipe fetches the shared tree
FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"
SRC_URI = "file://guard"
S = "${WORKDIR}/guard"

inherit allarch

# Services known to stall the platform; the distro sets the list (conf/distro/alma.conf).
ALMA_MASKED_SERVICES ??= ""

do_install() {
    install -d ${D}${systemd_unitdir}/system.conf.d
    install -m 0644 ${S}/systemd/10-alma-watchdog.conf ${D}${systemd_unitdir}/system.conf.d/
    install -d ${D}${sysconfdir}/systemd/system
    for unit in ${ALMA_MASKED_SERVICES}; do
        ln -sf /dev/null ${D}${sysconfdir}/systemd/system/$unit
    done
}

FILES:${PN} += "${systemd_unitdir}/system.conf.d ${sysconfdir}/systemd/system"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
