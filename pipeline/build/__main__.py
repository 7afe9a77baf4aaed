"""``python -m pipeline.build ...``: build a corpus (``pipeline.build.launcher``).

This module only starts the launcher: everything the job pickles is defined
in modules imported by their real names (``pipeline.build.graph`` and below),
never in ``__main__``, where a worker could not find it.
"""

import sys

from pipeline.build.launcher import main

sys.exit(main())
