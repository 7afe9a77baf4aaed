"""What several benchmarks share besides the harness: the inputs they make and the instruments they run.

- ``images``: smooth web-sized JPEGs, photo-sized candidates, pHash distance;
- ``shuffles``: the FnApiRunner that measures the bytes each shuffle carries;
- ``training``: a synthetic shard directory and one short run of the trainer, timed per step.
"""
