import sys

from accord.sim.cli import main

sys.exit(main())
