"""``python3 -m servesweep.envcheck``: this host's card and facts."""
import sys

from servesweep.envcheck import main

sys.exit(main())
