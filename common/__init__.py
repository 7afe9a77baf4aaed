"""Shared ground under every other package: the record and shard schema, file
access, image opening and orientation. Imports nothing from the project's
other packages (``tests/test_layout.py`` checks it)."""
