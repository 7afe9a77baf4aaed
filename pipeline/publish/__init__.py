"""``python -m pipeline.publish``: a finished build checked, described and committed by one object."""
