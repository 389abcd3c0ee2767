"""The small stdlib-only library shared by the on-board programs and the host toolchain."""
