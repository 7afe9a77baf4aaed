"""The download stage: URL-only rows in, rows with image bytes (or a ``download/...`` rejection) out.

- ``addresses``: which destinations may be fetched (the network policy).
- ``fetch``: one URL -> its bytes or the reason it failed (HTTP client, no Beam).
- ``stage``: the Beam composite ``DownloadImages`` (a thin DoFn over ``fetch``).
"""
