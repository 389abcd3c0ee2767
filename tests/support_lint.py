"""Helpers for the lint tests: a layer oelint-adv passes, and a recipe with one known finding."""

from __future__ import annotations

from pathlib import Path

CLEAN_LAYER_CONF = """\
BBPATH .= ":${LAYERDIR}"

BBFILES += "${LAYERDIR}/recipes-*/*/*.bb ${LAYERDIR}/recipes-*/*/*.bbappend"

BBFILE_COLLECTIONS += "alma"
BBFILE_PATTERN_alma = "^${LAYERDIR}/"
BBFILE_PRIORITY_alma = "10"

LAYERVERSION_alma = "1"
LAYERSERIES_COMPAT_alma = "scarthgap"
LAYERDEPENDS_alma = "core"
"""

CLEAN_PACKAGEGROUP = """\
SUMMARY = "ALMA-OS test packagegroup"
DESCRIPTION = "A packagegroup that oelint-adv finds nothing to say about."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "base"
LICENSE = "MIT"

inherit packagegroup

RDEPENDS:${PN} = "\\
    busybox \\
"
"""

# A recipe that hard-codes /usr/bin: oelint.vars.pathhardcode.bindir, a warning reported at the function, line 10.
FLAWED_RECIPE = """\
SUMMARY = "ALMA-OS test tool"
DESCRIPTION = "Installs one script the wrong way."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "base"
LICENSE = "MIT"

SRC_URI = "file://alma-tool"

do_install() {
    install -d ${D}${bindir}
    install -m 0755 ${WORKDIR}/alma-tool /usr/bin/alma-tool
}

CVE_PRODUCT = "alma-tool"
BBCLASSEXTEND = "native"
"""


def make_clean_layer(root: Path) -> Path:
    layer = root / "layers" / "meta-alma"
    (layer / "conf").mkdir(parents=True, exist_ok=True)
    (layer / "conf" / "layer.conf").write_text(CLEAN_LAYER_CONF)
    img = layer / "recipes-core" / "images" / "alma-image.bb"
    img.unlink(missing_ok=True)
    for leftover in (layer / "recipes-core" / "images",):
        if leftover.exists() and not any(leftover.iterdir()):
            leftover.rmdir()
    pg = layer / "recipes-core" / "packagegroups"
    pg.mkdir(parents=True, exist_ok=True)
    (pg / "packagegroup-alma.bb").write_text(CLEAN_PACKAGEGROUP)
    return layer
