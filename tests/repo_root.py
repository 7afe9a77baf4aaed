"""The repository's root, for tests that run its commands or read its files wherever the test file sits."""

import pathlib

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
