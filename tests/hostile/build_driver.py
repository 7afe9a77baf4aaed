"""Run one build (``pipeline.build.launcher.run``) in this process and report what it wrote and used, as JSON.

The ``read`` counters are the ones the launcher stored beside the funnel
(``pipeline.publish.publisher.READ_COUNTS``), so a test can reconcile them with what
the input files state; the peak RSS is the whole build's (the FnApiRunner
runs in this process).
"""

import json
import sys

from read_harness import own_peak_rss


def main(argv):
    from apache_beam.io.filesystems import FileSystems

    from common.corpus_dir import resolve
    from pipeline.build import launcher
    from pipeline.publish.publisher import READ_COUNTS

    funnel = launcher.run(argv)
    peak = own_peak_rss()
    output = argv[argv.index("--output") + 1]
    with FileSystems.open(FileSystems.join(resolve(output), READ_COUNTS)) as handle:
        read = json.loads(handle.read())
    print(json.dumps({"funnel": funnel, "read": read, "peak_rss": peak}, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
