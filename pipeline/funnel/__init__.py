"""The funnel: what every part of the build counts into, how the counts are checked, and how they are shown.

The ground floor of ``pipeline/``: it imports no other part of it.
"""
