"""The tegraflash bundle, read once and the same way by ``alma verify`` and ``alma flash``.

- :mod:`.names`: what meta-tegra calls a bundle (``<image>-<machine>.rootfs-<stamp>.tegraflash.tar.gz``)
- :mod:`.envfile`: the one ``.env.initrd-flash`` parser (never executed)
- :mod:`.stream`: the one hashing + inflating stream (sha256 of the file while it inflates)
- :mod:`.members`: the one set of member checks (names, types, links, sizes)
- :mod:`.reader`: ``scan`` (verify: hash, env, checked members; nothing written)
- :mod:`.unpack`: the safe unpack (flash: no interpreter tar filter, nothing followed, bounded)

Threat model: docs/flash.md#bundle-threat-model.
"""
