"""`python -m accord_cassandra.testing` is the launcher CLI too."""

import sys

from accord_cassandra.testing.launcher import main

sys.exit(main())
