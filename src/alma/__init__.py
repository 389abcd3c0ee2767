"""ALMA-OS host toolchain: build, verify, gate, flash and watch ALMA-OS on Jetson Orin."""

__version__ = "0.1.0"
