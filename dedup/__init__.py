"""Near-duplicate removal: embedders, index sets, threshold calibration,
k-means buckets and the bucket join (ALIGN, Appendix A)."""
