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

# tools/guard/pyproject.toml: a PEP 517 build (setuptools) of the almaguard package and
# its console_scripts (alma-guard, alma-health, alma-fabric), installed as a wheel.
inherit python_setuptools_build_meta systemd

SYSTEMD_SERVICE:${PN} = "alma-guard.service"

do_install:append() {
    install -d ${D}${sysconfdir}/alma
    install -m 0644 ${S}/conf/guard.toml ${D}${sysconfdir}/alma/guard.toml
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/alma-guard.service ${D}${systemd_system_unitdir}/
    # The slice the guard freezes; eran-grid.service and its jobs run in it.
    install -m 0644 ${S}/systemd/alma-work.slice ${D}${systemd_system_unitdir}/
}

# The package is shared with alma-health and alma-fabric-network; their commands ride in
# their own packages so each recipe's package pulls in exactly what it runs.
PACKAGES =+ "${PN}-lib ${PN}-health ${PN}-fabric"
FILES:${PN}-lib += "${PYTHON_SITEPACKAGES_DIR}/almaguard ${PYTHON_SITEPACKAGES_DIR}/almaguard-*.dist-info"
FILES:${PN}-health += "${bindir}/alma-health"
FILES:${PN}-fabric += "${bindir}/alma-fabric"
FILES:${PN} += "${bindir}/alma-guard ${systemd_system_unitdir}/alma-work.slice"
CONFFILES:${PN} = "${sysconfdir}/alma/guard.toml"
# Stdlib pieces OE splits out of python3-core: calendar (datetime), socket (io), json,
# logging, tomllib; the board library.
RDEPENDS:${PN}-lib = "python3-almaboard python3-core python3-datetime python3-io python3-json python3-logging \
                      python3-tomllib"
RDEPENDS:${PN}-health = "${PN}-lib"
RDEPENDS:${PN}-fabric = "${PN}-lib"
RDEPENDS:${PN} = "${PN}-lib"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
