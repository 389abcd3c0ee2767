SUMMARY = "ALMA-OS update artefact: a signed .swu for the inactive A/B slot"
DESCRIPTION = "alma-image's rootfs for the inactive slot and the bootloader capsule \
               (tegra-bl.cap, armed on the board only when its version differs and is not \
               below the lowest supported one), described by a JSON sw-description signed \
               with CMS. Installed by alma update (docs/ota.md) or a hawkBit server."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "images"
LICENSE = "MIT"
CVE_PRODUCT = ""

SRC_URI = "file://sw-description"

inherit swupdate

# meta-swupdate's swupdate class reads these (oelint-adv does not know that layer's variables).
# nooelint: oelint.vars.mispell
IMAGE_DEPENDS = "alma-image tegra-uefi-capsules"
# nooelint: oelint.vars.mispell.unknown
SWUPDATE_IMAGES = "alma-image tegra-bl.cap"
# nooelint: oelint.vars.mispell.unknown
SWUPDATE_IMAGES_FSTYPES[alma-image] = ".rootfs.ext4"

# The signer (certificate + private key, PEM) lives on the build host, never in the layer:
# set ALMA_OTA_SIGNING_CERT / ALMA_OTA_SIGNING_KEY in local.conf (or sign later); an
# unsigned .swu is refused by every ALMA-OS board.
ALMA_OTA_SIGNING_CERT ??= ""
ALMA_OTA_SIGNING_KEY ??= ""
# nooelint: oelint.vars.mispell.unknown
SWUPDATE_SIGNING = "${@'CMS' if d.getVar('ALMA_OTA_SIGNING_KEY') else ''}"
# nooelint: oelint.vars.mispell.unknown
SWUPDATE_CMS_CERT = "${ALMA_OTA_SIGNING_CERT}"
# nooelint: oelint.vars.mispell.unknown
SWUPDATE_CMS_KEY = "${ALMA_OTA_SIGNING_KEY}"

# nooelint: oelint.task.noanonpython - skip (not fail) the recipe in builds without the ota feature
python __anonymous() {
    if d.getVar('ALMA_OTA') != '1':
        raise bb.parse.SkipRecipe('alma-image-swu needs feature ota (kas/features/ota.yml)')
}

# An image artefact for the target only.
BBCLASSEXTEND = ""
