SUMMARY = "ERAN-GRID: opt-in idle-cycle agent, installed disabled"
DESCRIPTION = "Runs queued work only while the board is genuinely idle, on AC power and \
               cool, and stops it the instant its owner returns; a yielded job is requeued \
               with its checkpoint, never lost. Ships with its unit disabled and \
               enabled = false in its configuration: nothing runs until an operator opts in."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "utils"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ccfa3f03eeb8180970a4e900f7ddc92"
CVE_PRODUCT = ""

# The on-board code is single-sourced from the repository's tools/idlegrid (never copied into
# the layer); ALMA_TOOLS_DIR is set from LAYERDIR in conf/layer.conf.
# nooelint: oelint.vars.bbvars.FILESPATH - a recipe-local search path is how one recipe fetches the shared tree
FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"
SRC_URI = "file://idlegrid"
S = "${WORKDIR}/idlegrid"

# tools/idlegrid/pyproject.toml: a PEP 517 build (setuptools) of the erangrid package and
# its eran-grid console_script, installed as a wheel.
inherit python_setuptools_build_meta systemd useradd

# Jobs run as eran-job: a uid that owns nothing of the agent's (docs/eran-grid.md, "Jobs run
# as a stranger"); nothing else of the image runs as it.
USERADD_PACKAGES = "${PN}"
USERADD_PARAM:${PN} = "--system --no-create-home --home-dir /nonexistent --shell /sbin/nologin --user-group eran-job"

# Opt-in: the unit is installed but never enabled (a 98- preset disables it); no timer,
# socket or path unit exists that could start it.
SYSTEMD_SERVICE:${PN} = "eran-grid.service"
SYSTEMD_AUTO_ENABLE:${PN} = "disable"

do_install:append() {
    install -d ${D}${datadir}/eran-grid/examples
    install -m 0755 ${S}/examples/hashchain.py ${D}${datadir}/eran-grid/examples/hashchain.py
    install -d ${D}${sysconfdir}/eran-grid
    install -m 0644 ${S}/conf/eran-grid.toml ${D}${sysconfdir}/eran-grid/eran-grid.toml
    # The queue's secret: root's alone, handed to the unit by LoadCredential= (empty = none).
    install -m 0600 ${S}/conf/queue-credentials ${D}${sysconfdir}/eran-grid/queue-credentials
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/eran-grid.service ${D}${systemd_system_unitdir}/eran-grid.service
}

CONFFILES:${PN} = "${sysconfdir}/eran-grid/eran-grid.toml ${sysconfdir}/eran-grid/queue-credentials"
# Exactly the stdlib parts the agent imports (oe-core's python3 manifest). The NATS backend
# needs nats-py, which the image does not ship: the SQLite queue is the default.
RDEPENDS:${PN} = "python3-almaboard python3-core python3-crypt python3-ctypes python3-datetime python3-io python3-json \
                  python3-netclient python3-sqlite3 python3-tomllib"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
