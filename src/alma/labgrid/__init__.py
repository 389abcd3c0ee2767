"""ALMA-OS for labgrid (``pip install 'alma-toolchain[labgrid]'``, docs/labgrid.md).

Importing this package registers the resources, drivers and the strategy with labgrid's
``target_factory`` (labgrid 26 has no plugin discovery: an env file names it under
``imports: [alma.labgrid]``; the exporter is ``alma-labgrid-exporter``).
"""

from alma.labgrid.driver import AlmaFlashDriver, AlmaRecoveryDriver, AlmaSSHDriver, FlashFailed
from alma.labgrid.resource import AlmaRecoveryBoard, NetworkAlmaRecoveryBoard
from alma.labgrid.strategy import AlmaStrategy

__all__ = [
    "AlmaFlashDriver",
    "AlmaRecoveryBoard",
    "AlmaRecoveryDriver",
    "AlmaSSHDriver",
    "AlmaStrategy",
    "FlashFailed",
    "NetworkAlmaRecoveryBoard",
]
