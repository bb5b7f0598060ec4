"""`python -m sparkdist` is the `sparkdist` command."""

import sys

from sparkdist.cli import main

sys.exit(main())
