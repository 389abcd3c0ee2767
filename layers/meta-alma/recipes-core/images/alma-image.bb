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

# Release rootfs guard: the distro already strips debug-tweaks and friends when
# ALMA_RELEASE = "1"; this re-checks the result, so a feature or package that still
# leaves a password-less root or an sshd accepting empty passwords fails the build.
alma_release_check[doc] = "Fail a release rootfs that allows password-less login"
python alma_release_check() {
    import os
    import re
    if d.getVar('ALMA_RELEASE') != '1':
        return
    rootfs = d.getVar('IMAGE_ROOTFS')
    sysconfdir = d.getVar('sysconfdir').lstrip('/')
    problems = []
    shadow = os.path.join(rootfs, sysconfdir, 'shadow')
    if os.path.exists(shadow):
        with open(shadow, encoding='utf-8') as f:
            for line in f:
                fields = line.rstrip('\n').split(':')
                if len(fields) > 1 and fields[0] == 'root' and fields[1] == '':
                    problems.append('shadow: root has an empty password')
    for name in ('sshd_config', 'sshd_config_readonly'):
        path = os.path.join(rootfs, sysconfdir, 'ssh', name)
        if os.path.exists(path):
            with open(path, encoding='utf-8') as f:
                if re.search(r'^\s*PermitEmptyPasswords\s+yes', f.read(), re.MULTILINE | re.IGNORECASE):
                    problems.append('ssh/%s: PermitEmptyPasswords yes' % name)
    if problems:
        bb.fatal('alma-image: a release build (ALMA_RELEASE = "1") must not allow password-less login: %s; '
                 'build with kas/features/development.yml for a debug image' % '; '.join(problems))
}
ROOTFS_POSTPROCESS_COMMAND += "alma_release_check"
ROOTFS_POSTPROCESS_COMMAND[vardeps] += "ALMA_RELEASE"
