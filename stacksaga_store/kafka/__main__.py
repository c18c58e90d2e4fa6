import sys

from stacksaga_store.kafka.cli import main

sys.exit(main())
