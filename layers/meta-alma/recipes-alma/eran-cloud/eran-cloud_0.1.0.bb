SUMMARY = "ERANCLOUD: Local-SGD training worker for ERAN-GRID's borrowed cycles"
DESCRIPTION = "eran-cloud client registers with a coordinator over NATS JetStream, pulls the \
               global model and its data shard, trains H local steps and pushes the delta; \
               it runs as an ERAN-GRID job (stopped when the owner returns, resumed from a \
               checkpoint), touches no device and fails closed. No unit of its own: only \
               ERAN-GRID, itself opt-in, ever starts it."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "utils"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ccfa3f03eeb8180970a4e900f7ddc92"
CVE_PRODUCT = ""

# Single-sourced from the repository's tools/erancloud (ALMA_TOOLS_DIR: conf/layer.conf).
# nooelint: oelint.vars.bbvars.FILESPATH - a recipe-local search path is how one recipe fetches the shared tree
FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"
SRC_URI = "file://erancloud"
S = "${WORKDIR}/erancloud"

# tools/erancloud/pyproject.toml: a PEP 517 build (setuptools) of the erancloud package and
# its eran-cloud console_script, installed as a wheel.
inherit python_setuptools_build_meta

# numpy from oe-core (1.26.4 in scarthgap), nats-py from this layer, and the stdlib parts
# the worker imports. scikit-learn is the coordinator's alone and never on the board.
RDEPENDS:${PN} = "python3-asyncio python3-core python3-crypt python3-io python3-json python3-math \
                  python3-nats-py python3-numpy"

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
