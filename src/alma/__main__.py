import sys

from alma.cli.main import main

sys.exit(main())
