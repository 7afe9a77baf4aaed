"""``--dry_run=true`` with ``--runner DataflowRunner``: the Dataflow job built as it would be submitted, not submitted.

    python -m pipeline.build --input 'gs://B/in/*.parquet' --output gs://B/corpus --preset align \\
        --setup_file alt-text-corpus-0.1.0/setup.py --requirements_file worker-requirements.txt \\
        --runner DataflowRunner --project P --region R --temp_location gs://B/tmp --dry_run=true

The launcher resolves and checks everything as for a real build (the
output is planned, the evaluation sets are read and embedded), then hands
the graph to Beam's ``DataflowRunner``, which translates it exactly as for a
submission: its overrides, Runner v2's portable proto, its pre-optimisation,
the SDK environment with ``--setup_file`` built into an sdist and
``--requirements_file`` staged. The runner returns before it stages or
submits anything. Nothing is written to ``--output`` (no marker, no build
request, no evaluation index: the graph carries the index's future path,
as a real build's does) and nothing is published.

What a real launch would do before the runner and a dry run skips: fill
Beam's requirements cache (one ``pip download`` per pinned requirement
from PyPI) and upload it with the sdist to the staging location. The
summary says what would be staged.

Dataflow refuses a job whose graph is over 10 MB or whose JSON request is
over 20 MB; the summary sets the job's two sizes against them.
"""

from __future__ import annotations

import collections
import hashlib
import os
import tarfile
import tempfile
from typing import Dict, List, NamedTuple, Optional, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, WorkerOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from pipeline.build.config import BuildConfig
from pipeline.build.graph import build_pipeline
from pipeline.publish.output_contract import is_remote
from pipeline.stages.eval_index import eval_index_at

#: Dataflow's limits (cloud.google.com/dataflow/docs/request-quotas): the job graph, and the CreateJob request.
GRAPH_LIMIT = 10 * 2**20
REQUEST_LIMIT = 20 * 2**20
PARDO = common_urns.primitives.PAR_DO.urn
ACCELERATOR = "beam:resources:accelerator:v1"


class SideInput(NamedTuple):
    consumer: str  # the transform that reads it
    source: str    # the transform whose output it is
    access: str    # iterable or multimap


class Staged(NamedTuple):
    name: str      # its name in the staging location
    path: str      # where it is on this machine
    size: int


class DryRun(NamedTuple):
    """The Dataflow job as the runner built it: what the summary reports and the tests check."""

    steps: int                    # leaf transforms of the portable graph (Dataflow's steps before fusion)
    graph_bytes: int              # the serialized portable pipeline (pipeline.pb, what the service translates)
    request_bytes: int            # the CreateJob request as JSON, the graph's location in place of the graph
    largest_payloads: List[Tuple[int, str]]  # (bytes, transform): the biggest pickled transforms
    side_inputs: List[SideInput]
    staged: List[Staged]          # the SDK environment's artifacts: requirements, the sdist, ...
    pinned: List[str]             # --requirements_file's requirement lines
    unpinned: List[str]           # the sdist's own requirements that --requirements_file does not pin
    container: str                # the SDK container image the workers start
    job_name: str
    staging_location: str
    temp_location: str
    proto: object                 # the portable pipeline (beam_runner_api_pb2.Pipeline)


def build_job(config: BuildConfig, options, notes: dict, loaded=None) -> DryRun:
    """The graph translated by ``DataflowRunner`` with ``dry_run`` set (``options`` say so); nothing staged or sent."""
    # A real launch downloads every pin into Beam's requirements cache here (pip against PyPI) to upload
    # it; the job's graph is the same without, and a dry run touches no network.
    options.view_as(SetupOptions).requirements_cache = "skip"
    eval_index = eval_index_at(loaded, config.version_dir) if loaded is not None else None
    p = beam.Pipeline(options=options)
    build_pipeline(p, config, notes, eval_index)
    # Beam's stager builds the sdist and copies the requirements into directories of its own that a
    # submission uploads and a dry run would leave behind: here they are made in one that goes.
    saved = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="dry_run_") as scratch:
        tempfile.tempdir = scratch
        try:
            result = p.run()
        finally:
            tempfile.tempdir = saved
        job = result.job
        proto = job.proto_pipeline
        staged = _staged(proto)
        requirements = options.view_as(SetupOptions).requirements_file
        pinned = _requirement_lines(requirements) if requirements else []
        unpinned = _unpinned(staged, pinned)
    graph = proto.SerializeToString()
    cloud = job.google_cloud_options  # the runner's copy: it names the job and its staging location
    request = _request_json(job, job.options, graph, [s.name for s in staged])
    return DryRun(
        steps=sum(1 for t in proto.components.transforms.values() if not t.subtransforms),
        graph_bytes=len(graph), request_bytes=len(request),
        largest_payloads=_largest_payloads(proto), side_inputs=_side_inputs(proto), staged=staged,
        pinned=pinned, unpinned=unpinned, container=_container(options),
        job_name=cloud.job_name, staging_location=cloud.staging_location, temp_location=cloud.temp_location,
        proto=proto,
    )


def _request_json(job, options, graph: bytes, packages: List[str]) -> bytes:
    """The CreateJob request's body as ``DataflowApplicationClient.create_job_description`` would fill it."""
    from apache_beam.runners.internal import names as shared_names
    from apache_beam.runners.dataflow.internal import apiclient

    staging = options.view_as(GoogleCloudOptions).staging_location
    job.proto.environment = apiclient.Environment(
        packages=packages, options=options, environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url=FileSystems.join(staging, shared_names.STAGED_PIPELINE_FILENAME),
        proto_pipeline=job.proto_pipeline, pipeline_proto_hash=hashlib.sha256(graph).hexdigest()).proto
    return job.json().encode("utf-8")


def _producers(proto) -> Dict[str, str]:
    found = {}
    for transform in proto.components.transforms.values():
        if not transform.subtransforms:
            for pcoll in transform.outputs.values():
                found[pcoll] = transform.unique_name
    return found


def _side_inputs(proto) -> List[SideInput]:
    producers = _producers(proto)
    found = []
    for transform in proto.components.transforms.values():
        if transform.spec.urn != PARDO:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        for tag, side in payload.side_inputs.items():
            access = side.access_pattern.urn.rsplit(":", 2)[-2]  # beam:side_input:multimap:v1 -> multimap
            found.append(SideInput(transform.unique_name, producers.get(transform.inputs[tag], "?"), access))
    return sorted(found)


def accelerators(proto) -> Dict[str, str]:
    """Leaf transform -> the accelerator its environment's resource hints ask for (``--nsfw_accelerator``)."""
    environments = proto.components.environments
    found = {}
    for transform in proto.components.transforms.values():
        if not transform.subtransforms and transform.environment_id in environments:
            hint = environments[transform.environment_id].resource_hints.get(ACCELERATOR)
            if hint:
                found[transform.unique_name] = hint.decode("utf-8")
    return found


def _largest_payloads(proto, count: int = 3) -> List[Tuple[int, str]]:
    sizes = [(len(t.spec.payload), t.unique_name) for t in proto.components.transforms.values() if not t.subtransforms]
    return sorted(sizes, reverse=True)[:count]


def _staged(proto) -> List[Staged]:
    found = {}
    for environment in proto.components.environments.values():
        for dependency in environment.dependencies:
            if dependency.type_urn != common_urns.artifact_types.FILE.urn:
                continue
            path = beam_runner_api_pb2.ArtifactFilePayload.FromString(dependency.type_payload).path
            name = os.path.basename(path)
            if dependency.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
                name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dependency.role_payload).staged_name
            found[name] = Staged(name, path, os.path.getsize(path) if os.path.exists(path) else 0)
    return sorted(found.values())


def _requirement_lines(path: str) -> List[str]:
    with open(path) as handle:
        lines = (line.split("#", 1)[0].strip() for line in handle)
        return [line for line in lines if line and not line.startswith("-")]


def _canonical(name: str) -> str:
    from pipeline.build.worker_requirements import canonical

    return canonical(name)


def _unpinned(staged: List[Staged], pinned: List[str]) -> List[str]:
    """The sdist's base requirements that no ``--requirements_file`` line names: workers take their newest release."""
    from packaging.requirements import Requirement

    sdists = [s.path for s in staged if s.name == "workflow.tar.gz" and os.path.exists(s.path)]
    if not sdists:
        return []
    names = {_canonical(Requirement(line).name) for line in pinned}
    wanted = []
    with tarfile.open(sdists[0]) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] == "PKG-INFO":
                text = tar.extractfile(member).read().decode("utf-8", "replace")
                wanted = [line.split(":", 1)[1].strip() for line in text.splitlines()
                          if line.startswith("Requires-Dist:")]
    base = [Requirement(text) for text in wanted]
    return sorted(str(r) for r in base if r.marker is None and _canonical(r.name) not in names)


def _container(options) -> str:
    from apache_beam.runners.dataflow.internal import apiclient

    return options.view_as(WorkerOptions).sdk_container_image or apiclient.get_container_image_from_options(options)


def _mb(size: int) -> str:
    return f"{size / 2**20:.2f} MiB" if size >= 2**20 else f"{size / 1024:.1f} KiB"


def _short(name: str, parts: int = 3) -> str:
    pieces = name.split("/")
    return "/".join(pieces[:parts]) + ("/..." if len(pieces) > parts else "")


def summary(job: DryRun, config: BuildConfig, loaded=None) -> str:
    """The one block the launcher prints."""
    flags = config.flags
    lines = [
        f"dry run: Dataflow job {job.job_name!r} built (Runner v2) and not submitted; "
        f"nothing written to {config.output}",
        f"  steps: {job.steps:,} (transforms before Dataflow fuses them)",
        f"  job graph: {_mb(job.graph_bytes)} of Dataflow's {_mb(GRAPH_LIMIT)}; CreateJob request "
        f"{_mb(job.request_bytes)} of {_mb(REQUEST_LIMIT)}; largest transform: "
        + ", ".join(f"{_short(name)} {_mb(size)}" for size, name in job.largest_payloads[:1]),
        f"  side inputs: {len(job.side_inputs)} (where read: how many <- computed by; none is data in the graph)",
    ]
    readers = collections.defaultdict(list)
    for side in job.side_inputs:
        readers[_short(side.consumer, 2)].append(_short(side.source, 3).removesuffix("/..."))
    lines += [f"    {consumer}: {len(sources)} <- {', '.join(sorted(set(sources)))}"
              for consumer, sources in sorted(readers.items())]
    hinted = collections.defaultdict(list)
    for name, accelerator in accelerators(job.proto).items():
        hinted[accelerator].append(name)
    lines += [f"  on accelerator workers ({accelerator}): {len(names)} step(s) of "
              f"{', '.join(sorted({_short(name, 3).removesuffix('/...') for name in names}))}"
              for accelerator, names in sorted(hinted.items())]
    reads = [f"{len(config.input_files):,} input file(s) matching {flags.input}"]
    if loaded is not None:
        index = loaded[0]
        skipped = f", {len(index.skipped):,} skipped" if index.skipped else ""
        reads.append(f"the evaluation index ({index.num_images:,} images{skipped}: {len(index):,} rows x {index.dim}, "
                     f"{_mb(4 * len(index) * index.dim)} of vectors, which the launcher writes under the build's "
                     f"version)")
    if config.scorer is not None:
        reads.append(f"the pair model {flags.model_score} {' '.join(flags.model_score_args)}".rstrip())
    lines.append("  workers read: " + "; ".join(reads))
    lines.append(f"  workers start: {job.container}")
    staged = ", ".join(f"{s.name} ({_mb(s.size)})" for s in job.staged) or "nothing"
    lines.append(f"    staged for them: {staged}")
    if job.pinned:
        lines.append(f"    pip installs {len(job.pinned)} pinned requirement(s) from --requirements_file"
                     f" (a real launch downloads and stages each first)")
    if job.unpinned:
        lines.append(f"    not pinned there, installed at their newest release: {', '.join(job.unpinned)}")
    if not any(s.name == "workflow.tar.gz" for s in job.staged):
        lines.append("    no --setup_file: workers cannot import this package (docs/dataflow.md)")
    lines.append(f"  writes: the build to {config.version_dir}/, committed as {config.output} when it is published"
                 + (f"; downloaded images to {config.download_staging}/" if config.download is not None else ""))
    lines.append(f"  Dataflow's own files: staging {job.staging_location}, temp {job.temp_location}")
    reused = (config.previous.version_dir,) if config.previous is not None else ()
    local = [path for path in (flags.input, config.output, *(p for _, p in config.eval_sets), *reused)
             if not is_remote(path)]
    if config.previous is not None:
        lines.append(f"  reuses: the facts of {config.previous.version_dir} ({len(config.previous.tables):,} input "
                     "file(s) in its candidate table)")
    if local:
        lines.append(f"  note: local path(s) that Dataflow workers cannot reach: {', '.join(local)}")
    return "\n".join(lines)


class JobRefused(Exception):
    """The job as built is one Dataflow would refuse (its size)."""


def over_limit(job: DryRun) -> Optional[str]:
    """Why Dataflow would refuse the job, or None."""
    if job.graph_bytes > GRAPH_LIMIT:
        return f"the job graph is {job.graph_bytes:,} bytes, over Dataflow's limit of {GRAPH_LIMIT:,}"
    if job.request_bytes > REQUEST_LIMIT:
        return f"the CreateJob request is {job.request_bytes:,} bytes, over Dataflow's limit of {REQUEST_LIMIT:,}"
    return None
