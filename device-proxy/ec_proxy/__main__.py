"""`python -m ec_proxy`: the device proxy's command (see ec_proxy.cli)."""

import sys

from ec_proxy.cli import main

sys.exit(main())
