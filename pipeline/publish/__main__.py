"""``python -m pipeline.publish OUTPUT``: publish a finished build (``pipeline.publish.publisher``)."""

from pipeline.publish.publisher import main

main()
