"""Near-duplicate removal: embedders, index sets, threshold calibration,
k-means lists and buckets, the bucket join (ALIGN, Appendix A)."""

import os

# faiss runs on OpenMP and numpy on its own OpenBLAS threads. With OpenMP's
# default spin-waiting, faiss's idle threads keep the cores busy after every
# faiss call, and the numpy products that follow (dedup.cluster_lists,
# dedup.verify) ran 3.5-8x slower on 2 cores (benchmarks/RESULTS.md). Passive
# waiting must be chosen before the OpenMP runtime starts, i.e. before faiss
# is imported; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
