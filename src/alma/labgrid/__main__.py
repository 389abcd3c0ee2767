"""``python -m alma.labgrid --board USB_PATH``: the flash service (alma.labgrid.service)."""

import sys

from alma.labgrid.service import main

sys.exit(main())
