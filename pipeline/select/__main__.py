"""``python -m pipeline.select CORPUS --output NEW (--where EXPRESSION | --keys FILE)`` (``pipeline.select.selector``)."""

from pipeline.select.selector import main

main()
