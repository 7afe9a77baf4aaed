"""``python -m pipeline.select``: a committed corpus of the records a selection over a build's candidate table names.

The selection is read off the candidate table (``pipeline.write.candidate_table``)
and written by the build's own second pass (``pipeline.write.second_pass``):
no rule judges again, and a stored picture is copied from the source corpus's
shard (``pipeline.write.stored_copies``), never decoded again. See
``pipeline.select.selector``.
"""
