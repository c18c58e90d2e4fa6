import sys

from accord_cassandra.cli import main

sys.exit(main())
