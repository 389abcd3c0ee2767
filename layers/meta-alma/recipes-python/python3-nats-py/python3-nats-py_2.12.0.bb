SUMMARY = "NATS client for Python (asyncio): JetStream, key-value and object store"
DESCRIPTION = "The pure-Python NATS client ERANCLOUD's worker talks to its coordinator with. \
               Not in meta-python for scarthgap, hence here. 2.12.0 is the newest release \
               whose sdist builds with scarthgap's setuptools 69 (2.13 uses a PEP 639 \
               licence expression, 2.14 and later the uv_build backend)."
HOMEPAGE = "https://github.com/nats-io/nats.py"
BUGTRACKER = "https://github.com/nats-io/nats.py/issues"
SECTION = "devel/python"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=86d3f3a95c324c9479bd8986968f4327"
CVE_PRODUCT = "nats-py"

# The sdist is nats_py-<version>.tar.gz (PyPI normalises the project name nats-py).
PYPI_PACKAGE = "nats_py"
SRC_URI[sha256sum] = "2981ca4b63b8266c855573fa7871b1be741f1889fd429ee657e5ffc0971a38a1"

inherit pypi python_setuptools_build_meta

# What nats/ imports from the standard library (oe-core's python3 manifest). The optional
# extras (nkeys, aiohttp, fast-mail-parser) are not used by ERANCLOUD and not shipped.
RDEPENDS:${PN} = "python3-asyncio python3-core python3-crypt python3-datetime python3-email python3-io \
                  python3-json python3-logging python3-math python3-netclient"

# Pure Python: usable in the SDK and on the build host too.
BBCLASSEXTEND = "native nativesdk"
