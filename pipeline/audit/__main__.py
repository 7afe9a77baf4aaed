"""``python -m pipeline.audit OUT_DIR``: the funnel, the checks and the HTML report (``pipeline.audit.auditor``)."""

import sys

from pipeline.audit.auditor import main

sys.exit(main())
