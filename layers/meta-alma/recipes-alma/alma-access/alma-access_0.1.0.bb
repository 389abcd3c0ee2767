SUMMARY = "ALMA-OS admin access: keys-only sshd policy and the admin user"
DESCRIPTION = "alma-access-sshd: an sshd_config.d drop-in allowing public-key logins only \
               (no password, no keyboard-interactive, no root), one dropping clients that stopped \
               answering, and an sshd@.service drop-in ending every process of a session when \
               its connection ends. alma-access-admin: the admin \
               user (ALMA_ADMIN_USER, default alma) in group wheel, which may use sudo, with \
               the public keys of ALMA_ADMIN_KEYS as its authorized_keys and no password."
HOMEPAGE = "https://github.com/alma-os/alma-toolchain"
BUGTRACKER = "https://github.com/alma-os/alma-toolchain/issues"
SECTION = "base"
LICENSE = "MIT"
# Config files only, no upstream source: oe-core's copy of the MIT text is the license file.
# nooelint: oelint.var.licenseremotefile
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/MIT;md5=0835ade698e0bcf8506ecda2f7b4f302"
CVE_PRODUCT = ""

SRC_URI = "\
    file://50-alma-keys-only.conf \
    file://50-alma-session-end.conf \
    file://50-alma-client-alive.conf \
    file://50-alma-admin.sudoers \
"
S = "${WORKDIR}"

inherit allarch useradd

# Set by the distro (conf/distro/alma.conf) and by `alma build` (alma-build.conf):
# ALMA_ADMIN_KEYS holds public key lines separated by ";".
ALMA_ADMIN_USER ??= "alma"
ALMA_ADMIN_KEYS ??= ""

PACKAGES = "${PN}-sshd ${PN}-admin"
FILES:${PN}-sshd += "${sysconfdir}/ssh/sshd_config.d ${systemd_system_unitdir}/sshd@.service.d"
FILES:${PN}-admin += "/home/${ALMA_ADMIN_USER} ${sysconfdir}/sudoers.d"
RDEPENDS:${PN}-sshd = "openssh-sshd"
RDEPENDS:${PN}-admin = "${PN}-sshd sudo"

USERADD_PACKAGES = "${PN}-admin"
USERADD_PARAM:${PN}-admin = "--create-home --home-dir /home/${ALMA_ADMIN_USER} --shell /bin/sh --groups wheel --user-group ${ALMA_ADMIN_USER}"

# The keys are checked again here (the layer may be built without alma): each line must be
# "<type> <base64> [plain comment]", so nothing in it can reach a shell or bitbake expansion.
alma_write_authorized_keys[doc] = "Check ALMA_ADMIN_KEYS and write them as the admin user's authorized_keys"
python alma_write_authorized_keys() {
    import base64
    import re
    line_re = re.compile(r'^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa|sk-ssh-ed25519@openssh\.com|'
                         r'sk-ecdsa-sha2-nistp256@openssh\.com) ([A-Za-z0-9+/]+={0,2})( [A-Za-z0-9@._+-]{1,64})?$')
    keys = [k.strip() for k in (d.getVar('ALMA_ADMIN_KEYS') or '').split(';') if k.strip()]
    for n, key in enumerate(keys, 1):
        m = line_re.match(key)
        if not m:
            bb.fatal('alma-access: ALMA_ADMIN_KEYS entry %d is not an OpenSSH public key line '
                     '("<type> <base64> [comment]"); pass keys with alma build --admin-key FILE' % n)
        blob = base64.b64decode(m.group(3))
        if blob[4:4 + int.from_bytes(blob[:4], 'big')] != m.group(1).encode():
            bb.fatal('alma-access: ALMA_ADMIN_KEYS entry %d: the key data is not a %s key' % (n, m.group(1)))
    with open(os.path.join(d.getVar('WORKDIR'), 'authorized_keys'), 'w') as f:
        f.write(''.join(k + '\n' for k in keys))
}
do_install[prefuncs] += "alma_write_authorized_keys"
do_install[vardeps] += "ALMA_ADMIN_KEYS ALMA_ADMIN_USER"

do_install() {
    install -D -m 0644 ${WORKDIR}/50-alma-keys-only.conf ${D}${sysconfdir}/ssh/sshd_config.d/50-alma-keys-only.conf
    install -D -m 0644 ${WORKDIR}/50-alma-client-alive.conf ${D}${sysconfdir}/ssh/sshd_config.d/50-alma-client-alive.conf
    # oe-core's per-connection sshd@.service: the session ends with its connection
    install -D -m 0644 ${WORKDIR}/50-alma-session-end.conf ${D}${systemd_system_unitdir}/sshd@.service.d/50-alma-session-end.conf
    install -D -m 0440 ${WORKDIR}/50-alma-admin.sudoers ${D}${sysconfdir}/sudoers.d/50-alma-admin
    # sshd's StrictModes: home and ~/.ssh owned by the user, not writable by others
    install -d -m 0755 -o ${ALMA_ADMIN_USER} -g ${ALMA_ADMIN_USER} ${D}/home/${ALMA_ADMIN_USER}
    install -d -m 0700 -o ${ALMA_ADMIN_USER} -g ${ALMA_ADMIN_USER} ${D}/home/${ALMA_ADMIN_USER}/.ssh
    install -m 0600 -o ${ALMA_ADMIN_USER} -g ${ALMA_ADMIN_USER} ${WORKDIR}/authorized_keys \
        ${D}/home/${ALMA_ADMIN_USER}/.ssh/authorized_keys
}

# useradd leaves the password field "!" (locked); sshd without PAM refuses even a key login
# for a locked account. "*" matches no password, so the account is keys-only and usable.
pkg_postinst:${PN}-admin() {
    sed -i "s/^${ALMA_ADMIN_USER}:![^:]*:/${ALMA_ADMIN_USER}:*:/" $D${sysconfdir}/shadow
}

# On-board only: no native or nativesdk variant.
BBCLASSEXTEND = ""
