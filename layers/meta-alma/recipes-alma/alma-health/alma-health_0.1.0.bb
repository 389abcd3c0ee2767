SUMMARY = "ALMA-OS health watchdog: alert-only checks run by a timer"
DESCRIPTION = "alma-health checks storms, memory, GPU faults, thermal state and the guard, \
               fabric links, the hardware watchdog and disk space, and prints one \
               Nagios-style line (or --json) with the worst severity as exit code. \
               It takes no action."
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

inherit systemd allarch

SYSTEMD_SERVICE:${PN} = "alma-health.timer"

# The command itself is built with the almaguard package (alma-guard's recipe, package
# alma-guard-health); this recipe ships its configuration and units.
do_install() {
    install -d ${D}${sysconfdir}/alma
    install -m 0644 ${S}/conf/health.toml ${D}${sysconfdir}/alma/health.toml
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/alma-health.service ${D}${systemd_system_unitdir}/
    install -m 0644 ${S}/systemd/alma-health.timer ${D}${systemd_system_unitdir}/
}

FILES:${PN} += "${systemd_system_unitdir}/alma-health.service"
CONFFILES:${PN} = "${sysconfdir}/alma/health.toml"
RDEPENDS:${PN} = "alma-guard-health"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
