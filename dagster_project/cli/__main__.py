"""`python -m dagster_project.cli`: the `dflash` command (`make demo` runs it so)."""

import sys

from dagster_project.cli import main

sys.exit(main())
