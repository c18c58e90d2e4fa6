"""`python -m accord_cassandra.launcher {fetch,up,down,status}`."""

import sys

from accord_cassandra.launcher.cli import main

sys.exit(main())
