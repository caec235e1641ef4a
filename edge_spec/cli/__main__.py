"""python -m edge_spec.cli"""

import sys

from edge_spec.cli.main import main

sys.exit(main())
