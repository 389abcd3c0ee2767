# nooelint: oelint.bbclass.underscores
# (the class name is the interface alma-image inherits; it exports no functions, so a dash is safe)
# Fail the image when any network configuration in the rootfs bridges a fabric port.
#
# The lab's broadcast storm came from a declarative bridge over fabric ports that came back
# on every boot; the fabric is routed point-to-point only (alma-fabric-network). The check
# is the stdlib module tools/guard/almaguard/netcheck.py, single-sourced with `alma lint`.
# Fabric ports: those named in the rootfs's /etc/alma/fabric.toml plus ALMA_FABRIC_PORTS.
#
# Usage (in an image recipe): inherit alma-fabric-check

# Extra interface names (or globs such as "enP*") to treat as fabric ports.
ALMA_FABRIC_PORTS ??= ""

alma_fabric_check[doc] = "Fail the rootfs when a networkd or NetworkManager config bridges a fabric port"
python alma_fabric_check() {
    import importlib.util
    import os
    import sys
    tools = d.getVar('ALMA_TOOLS_DIR')
    if not tools:
        bb.fatal("alma-fabric-check: ALMA_TOOLS_DIR is not set; conf/layer.conf of meta-alma sets it")
    path = os.path.join(tools, 'guard', 'almaguard', 'netcheck.py')
    spec = importlib.util.spec_from_file_location('alma_netcheck', path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        bb.fatal("alma-fabric-check: cannot load %s" % path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    extra = (d.getVar('ALMA_FABRIC_PORTS') or '').split()
    findings = mod.scan_rootfs(d.getVar('IMAGE_ROOTFS'), extra_ports=extra)
    for f in findings:
        bb.error("alma-fabric-check: %s:%d: %s" % (f.path, f.line, f.message))
    if findings:
        bb.fatal("alma-fabric-check: %d network config(s) bridge a fabric port; "
                 "fabric links must be routed point-to-point (see docs/guard.md)" % len(findings))
    bb.note("alma-fabric-check: no fabric port is bridged")
}

ROOTFS_POSTPROCESS_COMMAND += "alma_fabric_check"
# Re-run the check when the checker itself changes.
do_rootfs[file-checksums] += "${ALMA_TOOLS_DIR}/guard/almaguard/netcheck.py:True"
