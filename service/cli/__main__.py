"""`python -m service.cli`: the `sessionstate` command."""

import sys

from service.cli.dispatch import main

sys.exit(main())
