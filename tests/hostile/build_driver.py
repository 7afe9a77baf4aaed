"""Run one build (``pipeline.build.run``) in this process and report what the launcher saw, as JSON.

The ``read`` Metrics counters are captured as the launcher queries them, so a
test can reconcile them with what the input files state; the peak RSS is the
whole build's (the FnApiRunner runs in this process).
"""

import json
import resource
import sys


def main(argv):
    from pipeline import build
    from pipeline.read import READ_NAMESPACE

    seen = {}
    query = build.counters

    def counters(result, namespace=build.NS):
        found = query(result, namespace)
        if namespace == READ_NAMESPACE:
            seen["read"] = found
        return found

    build.counters = counters
    funnel = build.run(argv)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"funnel": funnel, "read": seen.get("read"), "peak_rss": peak}, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
