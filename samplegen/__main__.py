"""``python -m samplegen --out DIR [--num_candidates N] [--seed S] [--processes N]``."""

from __future__ import annotations

import sys
from typing import List, Optional

import samplegen
from common import cli
from samplegen.generate import write_sample


def main(argv: Optional[List[str]] = None) -> int:
    parser = cli.ArgumentParser(prog="python -m samplegen", description=samplegen.__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--num_candidates", type=int, default=3000, help="ordinary candidates (planted rows come on top)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=0, help="worker processes (0: one per CPU); never changes the output")
    args = parser.parse_args(argv)
    if args.num_candidates < 0:
        parser.error("--num_candidates must be >= 0")
    write_sample(args.out, args.num_candidates, args.seed, args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
