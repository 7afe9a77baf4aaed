"""The download stage: URL-only rows in, rows with image bytes (or a ``download/...`` rejection) out.

- ``addresses``: which destinations may be fetched (the network policy).
- ``resolver``: a worker's DNS (cache, retries, the caller's deadline).
- ``politeness``: per-host bounds (in flight, per second, pauses after 429/503) and routing keys.
- ``fetch``: one URL -> its bytes or the reason it failed (HTTP client, no Beam).
- ``worker``: what a worker process's fetching threads share (TLS context, DNS cache, host limiter).
- ``stage``: the Beam composite ``DownloadImages`` (a thin DoFn over ``fetch``).
"""
