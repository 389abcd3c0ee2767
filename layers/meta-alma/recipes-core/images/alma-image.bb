SUMMARY = "ALMA-OS: lean systemd image for NVIDIA Jetson Orin edge-AI nodes"
DESCRIPTION = "A headless compute node: systemd, OpenSSH, the ALMA-OS thermal guard, \
               health watchdog, watchdog policy, routed fabric network and ERAN-GRID \
               (opt-in, installed disabled)."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "images"
LICENSE = "MIT"
# An image has no upstream product of its own; its packages carry theirs.
CVE_PRODUCT = ""

# alma-fabric-check fails the rootfs when any network config bridges a fabric port.
inherit core-image alma-fabric-check

IMAGE_FEATURES += "ssh-server-openssh"
IMAGE_INSTALL = "\
    packagegroup-core-boot \
    packagegroup-alma \
    ${CORE_IMAGE_EXTRA_INSTALL} \
"
IMAGE_LINGUAS = ""
# ERANCLOUD (kas/features/erancloud.yml sets ALMA_ERANCLOUD = "1"): the Local-SGD worker and,
# through its RDEPENDS, python3-nats-py and python3-numpy. Absent otherwise.
IMAGE_INSTALL += "${@oe.utils.conditional('ALMA_ERANCLOUD', '1', 'eran-cloud', '', d)}"

# Release rootfs guard (classes/alma-release-check.bbclass): keys-only ssh, an admin key
# unless the image is sealed, no password-less root, no host keys or machine-id baked in.
inherit alma-release-check

# Feature ota (ALMA_OTA = "1"; without it the class does nothing): the A/B layout check,
# the update agent and slot tools (classes/alma-ota.bbclass, docs/ota.md).
inherit alma-ota
