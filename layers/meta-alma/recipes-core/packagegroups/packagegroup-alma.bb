SUMMARY = "ALMA-OS on-board components"
DESCRIPTION = "Everything ALMA-OS adds to a board: the thermal guard, the health \
               watchdog, the watchdog policy with masked services, the routed fabric \
               network and the opt-in ERAN-GRID idle-cycle agent (installed disabled)."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "base"
LICENSE = "MIT"

inherit packagegroup

# alma-access-sshd (keys-only sshd) always; the admin user unless the image is sealed
# (ALMA_ADMIN_ACCESS = "0"); alma-board-id prints the board's ssh host key on the console.
RDEPENDS:${PN} = "\
    alma-access-sshd \
    alma-board-id \
    alma-fabric-network \
    alma-guard \
    alma-health \
    alma-watchdog-config \
    eran-grid \
    python3-almaboard \
"
# nooelint: oelint.vars.dependsordered - the admin package is added apart: it depends on ALMA_ADMIN_ACCESS
RDEPENDS:${PN} += "${@'alma-access-admin' if d.getVar('ALMA_ADMIN_ACCESS') != '0' else ''}"
