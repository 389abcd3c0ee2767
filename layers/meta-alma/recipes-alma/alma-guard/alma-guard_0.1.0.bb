SUMMARY = "ALMA-OS thermal guard: pauses work before the measured reset point"
DESCRIPTION = "alma-guard polls every thermal zone, freezes the configured work slice \
               (cgroup v2 cgroup.freeze, SIGSTOP fallback) before the board's measured reset \
               temperature, resumes below a lower threshold after a hold-off, never kills \
               work, publishes /run/alma-guard/state.json and keeps reset forensics."
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

inherit systemd python3-dir allarch

SYSTEMD_SERVICE:${PN} = "alma-guard.service"

do_install() {
    install -d ${D}${PYTHON_SITEPACKAGES_DIR}/almaguard
    install -m 0644 ${S}/almaguard/*.py ${D}${PYTHON_SITEPACKAGES_DIR}/almaguard/
    install -d ${D}${bindir}
    install -m 0755 ${S}/alma-guard ${D}${bindir}/alma-guard
    install -d ${D}${sysconfdir}/alma
    install -m 0644 ${S}/conf/guard.toml ${D}${sysconfdir}/alma/guard.toml
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/alma-guard.service ${D}${systemd_system_unitdir}/
}

# The stdlib-only library is shared with alma-health and alma-fabric-network.
PACKAGES =+ "${PN}-lib"
FILES:${PN}-lib += "${PYTHON_SITEPACKAGES_DIR}/almaguard"
CONFFILES:${PN} = "${sysconfdir}/alma/guard.toml"
# Stdlib pieces OE splits out of python3-core: calendar (datetime), socket (io), json,
# logging, tomllib.
RDEPENDS:${PN}-lib = "python3-core python3-datetime python3-io python3-json python3-logging python3-tomllib"
RDEPENDS:${PN} = "${PN}-lib"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
