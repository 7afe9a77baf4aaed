"""Audit a built corpus: the funnel as a table, and a self-contained HTML report.

    python -m pipeline.audit OUT_DIR [--no_html] [--allow_incomplete] [--what_if PARAM=VALUE ...]

reads ``OUT_DIR/stats/`` (written by ``pipeline.build``), prints the funnel
(stage, in, rejected, out, % of input, top reasons) with the conservation
check ``input == written + rejected``, and writes ``OUT_DIR/stats/report.html``:
one file, every image and plot inlined as a ``data:`` URI, a Content Security
Policy that forbids anything else (no scripts, no network), so it can be
mailed, archived or opened offline. It shows what a person auditing a corpus
looks at: the funnel, the distributions with the preset's cuts, sampled
rejects of every reason with their alt-text, and the near-duplicate pairs.

Exit status: 0 if the funnel checks pass, 1 if they fail (the report is
still written, with the failure at the top), 2 if there is no readable funnel
(missing, or damaged: one line naming the file and what is wrong).

Any stats file may be missing (its stage did not run) or damaged: each is
read bounded and checked against its schema (``common.state_files``), and
the report shows what the others hold and says what it could not show (a
damaged file, a damaged distribution, the lines of a ``.jsonl`` file it
could not read).
Paths may be local or anything Beam's FileSystems reads (``gs://``).

The funnel table and its checks are ``pipeline.funnel.table`` (the build
prints its funnel with it), the stats are read by ``pipeline.audit.read_stats``,
the page is ``pipeline.audit.report``, the what-if ``pipeline.what_if.answer``;
this module is the command line.
"""

from __future__ import annotations

import posixpath
import sys
from typing import Optional, Sequence

from common import cli, files
from common.state_files import DamagedFile
from pipeline.audit.read_stats import REPORT_FILE, load_stats, read_funnel, stats_dir_of
from pipeline.audit.report import build_html
from pipeline.funnel.table import FUNNEL_FILE, check_funnel, format_funnel
from pipeline.what_if import answer as what_if


def render_report(data_dir: str) -> str:
    """Writes ``<stats dir>/report.html`` and returns its path."""
    loaded = load_stats(data_dir)
    path = files.join(loaded["stats_dir"], REPORT_FILE)
    files.write_text(path, build_html(loaded), mime_type="text/html")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli.ArgumentParser(prog="python -m pipeline.audit",
                                description="Print the funnel of a built corpus and write stats/report.html.")
    parser.add_argument("data_dir", help="build output directory (or its stats/ directory); local or gs://")
    parser.add_argument("--no_html", action="store_true", help="print the funnel only")
    parser.add_argument("--allow_incomplete", action="store_true",
                        help="audit a build that did not finish (no COMPLETED), e.g. to see where it stopped")
    parser.add_argument("--what_if", nargs="+", metavar="PARAM=VALUE", help="print the funnel these thresholds give")
    args = parser.parse_args(argv)
    from common import console
    from common.corpus_dir import IncompleteCorpus, require_completed

    stats_dir = stats_dir_of(args.data_dir)
    corpus_dir = args.data_dir if stats_dir != args.data_dir else (posixpath.dirname(stats_dir.rstrip("/")) or ".")
    try:
        require_completed(corpus_dir, args.allow_incomplete)
    except IncompleteCorpus as error:
        parser.exit(2, f"error: {error}\n")
    if argv is None:  # the command line, not a test: library chatter goes to a log file
        console.route_library_output("audit")
    try:
        funnel = read_funnel(stats_dir)
        if funnel is None:
            print(f"error: no {FUNNEL_FILE} in {stats_dir}: did the build finish?", file=sys.stderr)
    except DamagedFile as error:
        funnel = None
        print(f"error: {error}", file=sys.stderr)
    if args.what_if:
        return what_if.run(stats_dir, funnel, args.what_if)
    if funnel is not None:
        print(format_funnel(funnel))
    if not args.no_html:
        print(f"report: {render_report(args.data_dir)}")
    return 2 if funnel is None else (1 if check_funnel(funnel) else 0)
