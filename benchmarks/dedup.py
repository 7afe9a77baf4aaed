"""Speed of the near-duplicate search parts, and recall against exhaustive search.

    python -m benchmarks.dedup                      # everything, D = 64 (minutes on busy cores)
    python -m benchmarks.dedup --parts assign,candidates,verify --repeats 5
    python -m benchmarks.dedup --parts kmeans --kmeans-sample 250000 --kmeans-niter 10

Parts (targets on 2 cores):

- ``kmeans``: faiss spherical k-means, 4096 clusters on a 250k sample (<= 2 min).
- ``assign``: top-10 centroids, batches of 4096 rows (>= 20k images/s).
- ``candidates``: index rows sharing >= 3 of a query's 10 clusters
  (``SharedClusterIndex``), per index size (>= 100k corpus images/s).
- ``verify``: cosines of those candidate pairs in blocks (>= 20M pairs/s).
- ``exact``: the default search (``dedup.cluster_lists``), per index size:
  candidate generation alone (which lists each query probes) and the whole
  search (probe + compare the probed lists' rows in blocks).
- ``exhaustive``: both whole paths (exact lists; buckets = assign + candidates
  + verify) against ``faiss.IndexFlatIP.range_search`` on the same queries:
  speed-ups and recall (exhaustive search has recall 1).

Data: a mixture of 1,000 Gaussian blobs on the unit sphere in D dimensions
(blob tightness varied so that some blobs hold natural near-duplicates), with
planted copies of a quarter of the index rows at 0-20 degrees (cosine 0.94-1),
``--zipf`` for Zipf(1.2) blob sizes. Centroids: k-means on the corpus; the
exact search and the bucket parts use them thinned as ``--centroid-merge-cosine``
says, with the preset's meaning (``dedup.kmeans.resolve_merge_cosine``): 0
(default) thins the bucket parts' centroids at ``merge_cosine_for(threshold)``
and leaves the exact search's plain, as the Beam transform does; -1 is plain
k-means for both; a cosine thins both.

Every figure is the median of ``--repeats`` runs, as wall-clock rate and as
rate per CPU-second of this process (faiss and BLAS may use both cores, so
CPU-seconds can exceed wall seconds). The machine's load average is printed:
on shared cores wall-clock rates fall with it, CPU-time rates much less.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import harness, record
from dedup import buckets, cluster_lists, kmeans, verify
from dedup.synthetic import planted_embeddings

PARTS = ("kmeans", "assign", "candidates", "verify", "exact", "exhaustive")


def timed(fn, repeats):
    """(result of the last run, median wall seconds, median CPU seconds)."""
    timing = harness.timed(fn, repeats)
    return timing.result, timing.wall_s, timing.cpu_s


ROWS = []  # what the JSON records: every table row, as printed and as numbers


def line(text, **figures):
    print(text, flush=True)
    ROWS.append(dict(row=text, **figures))


def row(name, count, unit, wall, cpu, target="", extra=""):
    line(
        f"| {name} | {count / wall:,.0f} {unit}/s | {count / cpu:,.0f} {unit}/CPU-s | {target} | {extra} |",
        measure=name, count=count, unit=unit, wall_s=wall, cpu_s=cpu,
        per_s=count / wall, per_cpu_s=count / cpu, target=target, notes=extra,
    )


def load():
    return "load average %.1f %.1f %.1f" % tuple(record.load())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--num-clusters", type=int, default=4096)
    parser.add_argument("--corpus", type=int, default=250_000, help="corpus rows (the k-means sample)")
    parser.add_argument("--index-sizes", default="10000,30000,100000")
    parser.add_argument("--queries", type=int, default=20_000, help="queries for candidates/verify/exhaustive")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--threshold", type=float, default=0.975)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kmeans-sample", type=int, default=250_000)
    parser.add_argument("--kmeans-niter", type=int, default=kmeans.DEFAULT_NITER)
    parser.add_argument("--kmeans-repeats", type=int, default=1)
    parser.add_argument("--zipf", action="store_true")
    parser.add_argument("--centroid-merge-cosine", type=float, default=kmeans.AUTOMATIC_MERGE,
                        help="as the preset's centroid_merge_cosine: 0 automatic, -1 never, else the cosine")
    parser.add_argument("--json", default="", help="output path (default benchmarks/results/dedup[_zipf].json)")
    args = parser.parse_args(argv)
    run = record.Run()
    parts = set(args.parts.split(","))
    index_sizes = [int(s) for s in args.index_sizes.split(",")]

    import faiss

    print(f"# benchmarks.dedup D={args.dim} K={args.num_clusters} zipf={args.zipf} "
          f"centroid_merge_cosine={args.centroid_merge_cosine} faiss threads={faiss.omp_get_max_threads()} ({load()})", flush=True)
    corpus, index = planted_embeddings(max(args.corpus, args.kmeans_sample), max(index_sizes), args.dim, zipf=args.zipf)
    queries = corpus[: args.queries]
    print("| measure | wall clock | per CPU-second | target | notes |\n| --- | ---: | ---: | --- | --- |", flush=True)

    sample = corpus[: args.kmeans_sample]
    if "kmeans" in parts:
        centroids, wall, cpu = timed(
            lambda: kmeans.train_spherical_kmeans(sample, args.num_clusters, niter=args.kmeans_niter),
            args.kmeans_repeats,
        )
        line(f"| k-means {len(sample):,} x {args.num_clusters} clusters, niter={args.kmeans_niter} | "
             f"{wall:.1f} s | {cpu:.1f} CPU-s | <= 120 s | {wall / args.kmeans_niter:.1f} s per iteration |",
             measure="kmeans", wall_s=wall, cpu_s=cpu)
    else:
        # Fewer iterations when k-means itself is not measured: only the
        # cluster layout matters for the other parts.
        centroids = kmeans.train_spherical_kmeans(sample, args.num_clusters, niter=8)
    sizes = np.bincount(kmeans.CentroidAssigner(centroids).top_clusters(sample, 1)[:, 0], minlength=len(centroids))

    def thinned(buckets_search):
        merge = kmeans.resolve_merge_cosine(args.centroid_merge_cosine, args.threshold, buckets=buckets_search)
        if merge is None:
            return centroids
        kept = kmeans.thin_centroids(centroids, sizes, merge)
        line(f"| centroid thinning at cosine {merge:.4f} ({'buckets' if buckets_search else 'exact'}) | "
             f"{len(centroids)} -> {len(kept)} centroids | | | |")
        return kept

    exact_centroids = thinned(buckets_search=False)  # the exact search's
    centroids = thinned(buckets_search=True)
    assigner = kmeans.CentroidAssigner(centroids)
    batches = [queries[s : s + args.batch] for s in range(0, len(queries), args.batch)]

    if "assign" in parts:
        _, wall, cpu = timed(lambda: [assigner.top_clusters(b, 10) for b in batches], args.repeats)
        row(f"top-10 assignment, batches of {args.batch}", len(queries), "images", wall, cpu, ">= 20k images/s")

    query_clusters = np.concatenate([assigner.top_clusters(b, 10) for b in batches])
    index_clusters = assigner.top_clusters(index, 10)
    for m in index_sizes:
        if not parts & {"candidates", "verify"}:
            break
        shared = buckets.SharedClusterIndex(index_clusters[:m], len(centroids), 3)
        query_batches = [query_clusters[s : s + args.batch] for s in range(0, len(queries), args.batch)]
        shared.candidates(query_batches[0][:1])  # build the inverted lists outside the timing
        results, wall, cpu = timed(lambda: [shared.candidates(b) for b in query_batches], args.repeats)
        pairs = sum(len(q) for q, _ in results)
        if "candidates" in parts:
            row(f"candidates, index of {m:,} rows", len(queries), "images", wall, cpu, ">= 100k images/s",
                f"{pairs / len(queries):.0f} candidates per image; "
                f"{shared.expected_postings_per_query():.0f} inverted-list entries per image")
        if "verify" in parts:
            index_vectors = index[:m]

            def run_verify():
                out = []
                for (q, r), start in zip(results, range(0, len(queries), args.batch)):
                    out.append(verify.pair_cosines(queries[start : start + args.batch], index_vectors, q, r, normalized=True))
                return out

            _, wall, cpu = timed(run_verify, args.repeats)
            row(f"verification, index of {m:,} rows", pairs, "pairs", wall, cpu, ">= 20M pairs/s",
                f"{pairs:,} pairs in blocks of {verify.DEFAULT_BLOCK_PAIRS}")
    if "verify" in parts:
        left, right = queries[:1024], index[:4096]
        _, wall, cpu = timed(lambda: verify.block_cosines(left, right, normalized=True), args.repeats)
        row("dense block 1024 x 4096 (bucket-join cells)", left.shape[0] * right.shape[0], "dots", wall, cpu, "", "one matrix product")

    for m in index_sizes:
        if "exact" not in parts:
            break
        lists = cluster_lists.ClusterListIndex(index[:m], exact_centroids, args.threshold)
        cosines, wall, cpu = timed(lambda: [lists.centroids @ b.T for b in batches], args.repeats)
        row(f"exact: query-centroid cosines ({len(exact_centroids)} centroids; the product top-10 assignment also makes)",
            len(queries), "images", wall, cpu, "", "one matrix product per batch")
        probe_cosine = lists.probe_cosine[:, None]
        probed, wall, cpu = timed(lambda: [c >= probe_cosine for c in cosines], args.repeats)
        probes = sum(int(p.sum()) for p in probed)
        row(f"exact: candidate generation (list probes from those cosines), index of {m:,} rows", len(queries), "images",
            wall, cpu, ">= 100k images/s", f"{probes / len(queries):.1f} lists probed per image of {len(exact_centroids)}")
        found, wall, cpu = timed(lambda: [lists.search(b, normalized=True) for b in batches], args.repeats)
        compared = sum(f.compared_pairs for f in found)
        row(f"exact: whole search (probe + compare), index of {m:,} rows", len(queries), "images", wall, cpu, "",
            f"{compared / len(queries):,.0f} rows compared per image; {compared / wall / 1e6:,.0f}M pairs/s "
            f"({compared / cpu / 1e6:,.0f}M per CPU-s) including the probes")

    if "exhaustive" in parts:
        m = max(index_sizes)
        index_vectors = index[:m]
        shared = buckets.SharedClusterIndex(index_clusters[:m], len(centroids), 3)
        lists = cluster_lists.ClusterListIndex(index_vectors, exact_centroids, args.threshold)

        def exact_path():
            found = []
            for start in range(0, len(queries), args.batch):
                f = lists.search(queries[start : start + args.batch], normalized=True)
                found.append(np.stack([f.query_rows + start, f.index_rows], 1))
            return np.concatenate(found)

        def bucket_path():
            found = []
            for start in range(0, len(queries), args.batch):
                x = queries[start : start + args.batch]
                q, r = shared.candidates(assigner.top_clusters(x, 10))
                cos = verify.pair_cosines(x, index_vectors, q, r, normalized=True)
                hit = verify.above_threshold(cos, args.threshold)
                found.append(np.stack([q[hit] + start, r[hit]], 1))
            return np.concatenate(found)

        flat = faiss.IndexFlatIP(args.dim)
        flat.add(index_vectors)

        def exhaustive():
            lims, sims, ids = flat.range_search(queries, args.threshold)
            rows = np.repeat(np.arange(len(queries)), np.diff(lims.astype(np.int64)))
            keep = sims > args.threshold
            return np.stack([rows[keep], ids[keep]], 1)

        def flat_sims(pairs):
            return np.einsum("ij,ij->i", queries[pairs[:, 0]], index_vectors[pairs[:, 1]])

        truth, flat_wall, flat_cpu = timed(exhaustive, args.repeats)
        # Pairs within float rounding of the threshold may fall either way
        # between faiss and numpy dot products: recall counts clear pairs only.
        clear = flat_sims(truth) > args.threshold + 1e-5
        truth_set = set(map(tuple, truth[clear].tolist()))
        row(f"exhaustive faiss IndexFlatIP range_search, index {m:,}", len(queries), "images", flat_wall, flat_cpu, "",
            f"{len(truth_set):,} pairs above the threshold")
        for name, path in (("exact lists (probe + compare)", exact_path), ("bucket path (assign + candidates + verify)", bucket_path)):
            found, wall, cpu = timed(path, args.repeats)
            found_set = set(map(tuple, found.tolist()))
            lost = len(truth_set) - len(found_set & truth_set)
            row(f"{name}, index {m:,}", len(queries), "images", wall, cpu, "",
                f"recall {1 - lost / max(1, len(truth_set)):.5f} ({lost} of {len(truth_set):,} pairs lost); "
                f"speed-up over exhaustive {flat_wall / wall:.1f}x wall, {flat_cpu / cpu:.1f}x CPU")
    print(f"# done ({load()})", flush=True)
    run.write("dedup_zipf" if args.zipf else "dedup", {"args": vars(args), "rows": ROWS}, args.json)


if __name__ == "__main__":
    main()
