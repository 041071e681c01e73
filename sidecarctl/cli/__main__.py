"""`python -m sidecarctl.cli`: the same program as the `sidecarctl` console script."""

import sys

from sidecarctl.cli.main import main

sys.exit(main())
