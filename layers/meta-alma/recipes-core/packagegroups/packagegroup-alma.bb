SUMMARY = "ALMA-OS on-board components"
DESCRIPTION = "Everything ALMA-OS adds to a board: the thermal guard, the health \
               watchdog, the watchdog policy with masked services, the routed fabric \
               network and the opt-in ERAN-GRID idle-cycle agent (installed disabled)."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "base"
LICENSE = "MIT"

inherit packagegroup

RDEPENDS:${PN} = "\
    alma-fabric-network \
    alma-guard \
    alma-health \
    alma-watchdog-config \
    eran-grid \
    python3-almaboard \
"
