SUMMARY = "ALMA-OS board identity line on the serial console"
DESCRIPTION = "A oneshot unit that, once openssh made this board's host keys, writes \
               'alma-board: name=... addr=... hostkey=SHA256:...' where agetty shows it \
               before the login prompt (/etc/issue.d), so alma flash can pin the host key."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "base"
LICENSE = "MIT"
# Config files only, no upstream source: oe-core's copy of the MIT text is the license file.
# nooelint: oelint.var.licenseremotefile
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"
CVE_PRODUCT = ""

SRC_URI = "\
    file://alma-board-issue \
    file://alma-board-issue.service \
"
S = "${WORKDIR}"

inherit allarch systemd

SYSTEMD_SERVICE:${PN} = "alma-board-issue.service"

do_install() {
    install -D -m 0755 ${WORKDIR}/alma-board-issue ${D}${libexecdir}/alma-board-id/alma-board-issue
    install -D -m 0644 ${WORKDIR}/alma-board-issue.service ${D}${systemd_system_unitdir}/alma-board-issue.service
    sed -i -e 's,/usr/libexec/,${libexecdir}/,g' ${D}${systemd_system_unitdir}/alma-board-issue.service
    # agetty reads /etc/issue.d/*.issue (and follows the link into /run, writable on a read-only rootfs)
    install -d ${D}${sysconfdir}/issue.d
    ln -sf /run/alma-board/issue ${D}${sysconfdir}/issue.d/50-alma-board.issue
}

FILES:${PN} += "${libexecdir}/alma-board-id ${sysconfdir}/issue.d"
RDEPENDS:${PN} = "base-files openssh-keygen openssh-sshd util-linux-agetty"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
