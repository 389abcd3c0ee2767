# nooelint: oelint.bbclass.underscores - named like alma-release-check, the layer's other image checks
# alma-ota: what feature ota (ALMA_OTA = "1", kas/features/ota.yml) requires of an image.
#
#   - an A/B flash layout: USE_REDUNDANT_FLASH_LAYOUT must be "1"; a MACHINE that has no
#     redundant layout (HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL = "0", e.g. the
#     flash_l4t_external.xml targets) stops here, naming the machine;
#   - a release (ALMA_RELEASE = "1") must carry the OTA certificate (alma build --ota-key) and
#     must not sign its UEFI capsules with the EDK2 test certificates (meta-tegra's default
#     when UEFI_CAPSULE_*_CERT are unset) unless ALMA_OTA_ALLOW_TEST_CAPSULE_CERTS = "1"
#     (a lab build, said so in its name).
# The agent and the slot tools come in through alma-ota's RDEPENDS.
IMAGE_INSTALL:append = " ${@'alma-ota' if d.getVar('ALMA_OTA') == '1' else ''}"

# nooelint: oelint.task.noanonpython - the refusal must happen at parse time, before anything builds
python __anonymous() {
    if d.getVar('ALMA_OTA') != '1':
        return
    machine = d.getVar('MACHINE')
    if d.getVar('HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL') == '0' or d.getVar('USE_REDUNDANT_FLASH_LAYOUT') != '1':
        bb.fatal('feature ota needs an A/B (redundant rootfs) flash layout, and MACHINE %s has none '
                 '(HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL = "%s", USE_REDUNDANT_FLASH_LAYOUT = "%s"); '
                 'build this machine without the ota feature' % (machine,
                 d.getVar('HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL'), d.getVar('USE_REDUNDANT_FLASH_LAYOUT')))
    if d.getVar('ALMA_RELEASE') != '1':
        return
    if not d.getVar('ALMA_OTA_CERT'):
        bb.fatal('a release with feature ota needs ALMA_OTA_CERT (alma build --ota-key CERT.pem)')
    signer = d.getVar('UEFI_CAPSULE_SIGNER_PRIVATE_CERT') or ''
    if (not signer or 'Pkcs7Sign/Test' in signer) and d.getVar('ALMA_OTA_ALLOW_TEST_CAPSULE_CERTS') != '1':
        bb.fatal('release %s: the UEFI capsules would be signed with the EDK2 TEST certificates (%s); set '
                 'UEFI_CAPSULE_SIGNER_PRIVATE_CERT, UEFI_CAPSULE_OTHER_PUBLIC_CERT and '
                 'UEFI_CAPSULE_TRUSTED_PUBLIC_CERT, or ALMA_OTA_ALLOW_TEST_CAPSULE_CERTS = "1" for a lab build'
                 % (machine, signer or 'meta-tegra default'))
}
