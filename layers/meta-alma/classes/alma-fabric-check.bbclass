# nooelint: oelint.bbclass.underscores
# (the class name is the interface alma-image inherits; it exports no functions, so a dash is safe)
# Fail the image when any network configuration in the rootfs bridges a fabric port.
#
# The lab's broadcast storm came from a declarative bridge over fabric ports that came back
# on every boot; the fabric is routed point-to-point only (alma-fabric-network). The check
# is the board library's stdlib module almaboard.netcheck (tools/board), single-sourced with
# `alma lint` and `alma-fabric check`.
# Fabric ports: those named in the rootfs's /etc/alma/fabric.toml plus ALMA_FABRIC_PORTS.
#
# Usage (in an image recipe): inherit alma-fabric-check

# Extra interface names (or globs such as "enP*") to treat as fabric ports.
ALMA_FABRIC_PORTS ??= ""

alma_fabric_check[doc] = "Fail the rootfs when a networkd or NetworkManager config bridges a fabric port"
python alma_fabric_check() {
    # conf/layer.conf puts the board library on bitbake's path (addpylib).
    from almaboard import netcheck
    extra = (d.getVar('ALMA_FABRIC_PORTS') or '').split()
    findings = netcheck.scan_rootfs(d.getVar('IMAGE_ROOTFS'), extra_ports=extra)
    for f in findings:
        bb.error("alma-fabric-check: %s:%d: %s" % (f.path, f.line, f.message))
    if findings:
        bb.fatal("alma-fabric-check: %d network config(s) bridge a fabric port; "
                 "fabric links must be routed point-to-point (see docs/guard.md)" % len(findings))
    bb.note("alma-fabric-check: no fabric port is bridged")
}

ROOTFS_POSTPROCESS_COMMAND += "alma_fabric_check"
# Re-run the check when the checker itself changes.
do_rootfs[file-checksums] += "${ALMA_TOOLS_DIR}/board/almaboard/netcheck.py:True"
