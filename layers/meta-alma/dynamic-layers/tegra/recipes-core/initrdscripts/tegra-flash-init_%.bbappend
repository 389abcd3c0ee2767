# ALMA-OS: per-board identity at flash time, with meta-tegra's own mechanism
# (docs/initrd-flashing-support.md, "Production-Time Customization"): `alma flash` writes
# flashpkg-extra/alma/board.conf into each board's copy of the bundle, initrd-flash copies it
# into the flash package, and after the host wrote the rootfs the flashing initrd runs this
# hook from /init-extra.d. Format of board.conf: docs/formats.md#board-conf.
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
SRC_URI += "file://alma-board-identity"

do_install:append() {
    install -m 0755 ${WORKDIR}/alma-board-identity ${D}/init-extra.d/50-alma-board-identity
}
