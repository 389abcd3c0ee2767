SUMMARY = "ALMA-OS routed fabric: point-to-point networkd links, never a bridge"
DESCRIPTION = "alma-fabric generates systemd-networkd .network files for this node's \
               fabric ports from /etc/alma/fabric.toml at boot, as routed point-to-point \
               links with static addresses. No bridge is ever created."
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

SYSTEMD_SERVICE:${PN} = "alma-fabric-network.service"

# The command itself is built with the almaguard package (alma-guard's recipe, package
# alma-guard-fabric); this recipe ships its configuration and unit.
do_install() {
    install -d ${D}${sysconfdir}/alma
    install -m 0644 ${S}/conf/fabric.toml ${D}${sysconfdir}/alma/fabric.toml
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/alma-fabric-network.service ${D}${systemd_system_unitdir}/
}

CONFFILES:${PN} = "${sysconfdir}/alma/fabric.toml"
RDEPENDS:${PN} = "alma-guard-fabric"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
