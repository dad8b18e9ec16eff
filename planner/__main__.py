import sys

from planner.plan import main

sys.exit(main())
