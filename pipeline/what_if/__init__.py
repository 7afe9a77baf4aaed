"""The audit's what-if: the threshold rules, the histograms the build counts for them, and the answers."""
