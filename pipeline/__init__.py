"""The Beam job and its commands, one sub-package per part of the data flow.

    build/      python -m pipeline.build: options, the one resolved config, the launcher, the job graph
    readers/    input files of every format -> records, counted against what the files state
    download/   --download: each distinct URL fetched politely, staged, judged once
    stages/     the first pass (judge) and the stages that judge light rows: verdicts, near-duplicates, model score
    write/      the second pass: shards, the rejection ledger, TOnICS concept tags
    funnel/     the ground floor every part counts into: counters, the funnel and its table, accounting, stats files
    publish/    python -m pipeline.publish: the output contract, the commit object, the shard report
    audit/      python -m pipeline.audit: the funnel, the HTML report and its sections
    what_if/    the audit's what-if: the rules, their histograms (counted by the build), the answers

Imports point from the commands down to ``funnel/`` (``tests/test_layout.py``).
"""
