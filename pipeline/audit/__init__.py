"""``python -m pipeline.audit``: the funnel, its checks and the HTML report of a built corpus."""
