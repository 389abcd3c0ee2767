SUMMARY = "ALMA-OS board library: the stdlib-only code every on-board program shares"
DESCRIPTION = "almaboard: one error hierarchy with exit codes, atomic file writes, \
               root-prefixed machine paths, layered TOML configuration and typed fields with file:line \
               errors, thermal zone reading with plausibility rules, Nagios output and \
               the fabric bridge checker. alma-guard, alma-health, alma-fabric, alma-ota and \
               eran-grid import it."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "devel/python"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ccfa3f03eeb8180970a4e900f7ddc92"
CVE_PRODUCT = ""

# The on-board code is single-sourced from the repository's tools/board (never copied into
# the layer); ALMA_TOOLS_DIR is set from LAYERDIR in conf/layer.conf.
# nooelint: oelint.vars.bbvars.FILESPATH - a recipe-local search path is how one recipe fetches the shared tree
FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"
SRC_URI = "file://board"
S = "${WORKDIR}/board"

# tools/board/pyproject.toml: a PEP 517 build (setuptools), installed as a wheel.
inherit python_setuptools_build_meta

# Stdlib pieces OE splits out of python3-core: calendar (datetime), json, logging, tomllib.
RDEPENDS:${PN} = "python3-core python3-datetime python3-io python3-json python3-logging python3-tomllib"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
