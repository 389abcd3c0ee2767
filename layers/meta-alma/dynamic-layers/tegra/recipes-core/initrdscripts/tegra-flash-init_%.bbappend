# ALMA-OS: per-board identity at flash time, with meta-tegra's own mechanism
# (docs/initrd-flashing-support.md, "Production-Time Customization"): `alma flash` writes
# flashpkg-extra/alma/board.conf into each board's copy of the bundle, initrd-flash copies it
# into the flash package, and after the host wrote the rootfs the flashing initrd runs this
# hook from /init-extra.d. Format of board.conf: docs/formats.md#board-conf.
# Only for the alma distro (the :alma override): another distro using meta-alma's recipes
# keeps meta-tegra's flash initrd as it is.
FILESEXTRAPATHS:prepend:alma := "${THISDIR}/files:"
SRC_URI:append:alma = " file://alma-board-identity"

do_install:append:alma() {
    install -m 0755 ${WORKDIR}/alma-board-identity ${D}/init-extra.d/50-alma-board-identity
}
