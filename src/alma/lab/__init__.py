"""Virtual boards: ALMA-OS's on-board userland, assembled as the image installs it
(tools/board-layout.toml), booted under real systemd in a container (``alma lab``, docs/lab.md)."""
