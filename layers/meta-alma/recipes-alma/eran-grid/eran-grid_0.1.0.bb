SUMMARY = "ERAN-GRID: opt-in idle-cycle agent (disabled by default)"
DESCRIPTION = "Runs queued work only while the board is genuinely idle, on AC power and cool; \
               yields the instant its owner returns. Ships disabled with enabled = false."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "utils"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"

# Skeleton (parseable): sources are single-sourced from tools/idlegrid in the next commit.
SRC_URI = "file://${ALMA_TOOLS_DIR}/idlegrid"

inherit allarch

RDEPENDS:${PN} = "python3-core"
