"""Publish a finished build: check its version, describe it, commit it, then remove what it replaced.

    python -m pipeline.publish OUTPUT [--build ID] [--replace] [--keep_previous]

A build's job writes everything into ``OUTPUT/versions/<id>/``. Publishing
it, from the launcher after the job or later from any machine (a detached
Dataflow launch), is:

1. check: the job's shard report (``stats/_shards.json``) against one
   listing of the files, the funnel's conservation law, the shard report
   against the funnel's written counts, the input against what the files'
   metadata state (``stats/read_counts.json``, when the launcher saw the
   job's counters);
2. describe the version in its own directory: ``features.json``,
   ``dataset_info.json`` and ``manifest.json`` (each shard's records,
   bytes and crc32c, the conservation line, what it replaces, the
   candidate table's files, and with ``--webdataset`` its tars, checked
   like the shards);
3. commit: write ``OUTPUT/dataset_info.json`` naming the version, one
   object, if no other build committed since this one started
   (``pipeline.publish.commit``); ``tfds.builder_from_directory(OUTPUT)`` and every
   reader of this project now read the new version;
4. delete the files of the version it replaced, unless kept; and for a
   build that downloads, the downloads (``_downloads/``) of builds that
   started no later than it, unless it was asked to keep them
   (``--download_keep``).

Every step can run again: a second run of a committed version only
finishes step 4. Nothing before step 3 changes what a reader sees.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Callable, List, Optional

from apache_beam.io.filesystems import FileSystems

from common import cli, corpus_dir
from common import state_files as sf
from common.corpus_dir import TARS_FILE
from common.files import escape_glob
from pipeline.funnel import candidate_counts
from pipeline.funnel.accounting import AccountingError, accounting_problems, counters_schema, verdict_accounting_problems
from pipeline.funnel.counts import funnel_schema
from pipeline.funnel.table import FUNNEL_FILE, as_int, format_funnel
from pipeline.publish import commit as commit_lib
from pipeline.publish import output_contract as output_lib
from pipeline.publish import shard_report, tfds_metadata

READ_COUNTS = "stats/read_counts.json"
#: The ``verdicts`` counters of the job, saved by an attached launcher (``pipeline.funnel.accounting``).
VERDICT_COUNTS = "stats/verdict_counts.json"
EXIT_PUBLISHED, EXIT_FAILED, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 3


class PublishError(Exception):
    """The version cannot be published as it is (one line); nothing a reader sees changed."""


@dataclasses.dataclass
class Published:
    version: str
    directory: str
    funnel: dict
    already: bool  # the version was committed before this call
    replaced: Optional[str]  # the version id it replaced, "" for a plain-layout corpus, None for nothing
    deleted: int
    downloads_deleted: int = 0  # staging files of this build and older ones (``_downloads/``)
    unlinked: List[str] = dataclasses.field(default_factory=list)  # symbolic links removed instead of their files


def request_schema(doc) -> dict:
    """``_BUILD.json`` (``write_request``), as the publication reads it."""
    sf.obj(doc)
    for name in ("name", "dataset_version", "description", "expects"):
        sf.text(sf.field(doc, name), name)
    for name in ("started", "replaces", "version"):
        sf.optional(doc, name, sf.text)
    for name in ("keep_previous", "download", "keep_downloads", "concepts"):
        sf.optional(doc, name, sf.flag)
    for i, column in enumerate(sf.array(doc.get("carried", []), "carried", max_len=1_000)):
        sf.text(column, f"carried[{i}]")
    return doc


def manifest_schema(doc) -> dict:
    """A version's ``manifest.json`` (``_describe``), as a later publication reads it."""
    sf.obj(doc)
    sf.optional(doc, "replaces", sf.text)
    return doc


def _read_json(path: str, schema: Callable):
    """A state file of the version, checked (None if absent); a damaged one is ``PublishError``, one line."""
    try:
        return sf.read_json(path, schema, "the build cannot be published as it is: run it again")
    except sf.DamagedFile as error:
        raise PublishError(str(error)) from None


def _write(path: str, text: str) -> None:
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def write_request(version_dir: str, request: dict) -> None:
    """What the build asked for, written first into its version (``publish`` reads it back)."""
    _write(FileSystems.join(version_dir, output_lib.REQUEST), json.dumps(request, indent=1, sort_keys=True) + "\n")


def current(output: str):
    """``(Committed, version it names or "" for a plain-layout corpus or None for none)``."""
    committed = commit_lib.read(output)
    if committed.data is None:
        return committed, None
    try:
        info = sf.parse(committed.data, f"{output}/{corpus_dir.COMMIT}", sf.obj)
    except sf.DamagedFile:
        raise PublishError(f"{output}/{corpus_dir.COMMIT} is not the JSON a publication writes: damaged, or not "
                           "written by a build") from None
    version = corpus_dir.committed_version(info)
    return committed, ("" if version is None else version)


def conservation_line(funnel: dict) -> str:
    written = sum(as_int(v) for v in (funnel.get("written") or {}).values())
    return (f"input {as_int(funnel.get('input')):,} = written {written:,} + rejected "
            f"{as_int(funnel.get('rejected_total')):,}")


def choose_version(output: str, committed_version: Optional[str]) -> str:
    """The version to publish when none is named: the newest whose build started after the committed one."""
    versions = corpus_dir.list_versions(output)
    if not versions:
        raise PublishError(f"{output} holds no build (no {corpus_dir.VERSIONS}/ directory)")
    return versions[-1] if not committed_version or versions[-1] > committed_version else committed_version


def _check(output: str, version: str, directory: str, request: dict):
    name = request["name"]
    funnel = _read_json(FileSystems.join(directory, "stats", FUNNEL_FILE), funnel_schema)
    if funnel is None or not FileSystems.exists(FileSystems.join(directory, shard_report.SHARDS_FILE)):
        raise PublishError(
            f"{directory}: the job has not finished writing (no stats/funnel.json or {shard_report.SHARDS_FILE}); "
            f"wait for it to finish, or name another build with --build")
    try:
        report = shard_report.read(directory, name)
        shard_report.check_files(directory, name, report)
    except (shard_report.ShardsMissing, sf.DamagedFile) as error:
        raise PublishError(str(error)) from None
    problems = accounting_problems(funnel, _read_json(FileSystems.join(directory, READ_COUNTS), counters_schema))
    problems += verdict_accounting_problems(_read_json(FileSystems.join(directory, VERDICT_COUNTS), counters_schema))
    summary = _read_json(FileSystems.join(directory, candidate_counts.SUMMARY_FILE),
                         candidate_counts.summary_schema)
    problems += candidate_counts.table_problems(summary, funnel)
    if summary is not None:
        table_dir = FileSystems.join(directory, candidate_counts.CANDIDATES_DIR)
        listed = {f"{candidate_counts.CANDIDATES_DIR}/{name}": size for name, size in _sizes(table_dir).items()}
        problems += candidate_counts.file_problems(summary, listed)
    for split, entry in report.items():
        if sum(entry["records"]) != as_int((funnel.get("written") or {}).get(split)):
            problems.append(f"split {split!r}: the shards hold {sum(entry['records']):,} records, "
                            f"the funnel says {as_int((funnel.get('written') or {}).get(split)):,} were written")
    if request.get("webdataset"):
        problems += _tar_problems(directory, funnel)
    if problems:
        raise AccountingError("; ".join(problems))
    return funnel, report


def tars_schema(doc) -> dict:
    """``stats/_webdataset.json``: per split, its tars' names, bytes and records (lists of one length)."""
    for split, entry in sf.mapping(doc, "", sf.obj, max_len=1_000).items():
        names = [sf.text(n, f"{split}.files") for n in sf.array(sf.field(entry, "files", split), f"{split}.files")]
        for column in ("bytes", "records"):
            values = sf.array(sf.field(entry, column, split), f"{split}.{column}", max_len=len(names))
            if len(values) != len(names):
                raise sf.Problem(f"{split}.{column}: {len(values)} entries for {len(names)} files")
            for value in values:
                sf.whole(value, f"{split}.{column}")
    return doc


def _tar_problems(directory: str, funnel: dict) -> List[str]:
    """The job's list of its WebDataset tars against one listing per split and the funnel's written counts."""
    document = _read_json(FileSystems.join(directory, TARS_FILE), tars_schema)
    if document is None:
        raise PublishError(f"{directory}: the job has not finished writing (no {TARS_FILE}); wait for it to finish")
    problems = []
    for split, entry in sorted(document.items()):
        listed = _sizes(FileSystems.join(directory, split))
        wrong = [(name, size) for name, size in zip(entry["files"], entry["bytes"])
                 if listed.get(name.rsplit("/", 1)[-1]) != size]
        if wrong:
            name, size = wrong[0]
            have = listed.get(name.rsplit("/", 1)[-1])
            raise PublishError(f"{TARS_FILE}: {len(wrong)} tar(s) of split {split!r} are not as reported, e.g. "
                               f"{name}: {'missing' if have is None else f'{have:,} bytes'}, reported {size:,} bytes")
        if sum(entry["records"]) != as_int((funnel.get("written") or {}).get(split)):
            problems.append(f"split {split!r}: the tars hold {sum(entry['records']):,} records, the funnel says "
                            f"{as_int((funnel.get('written') or {}).get(split)):,} were written")
    return problems


def _sizes(directory: str) -> dict:
    """``{file name: bytes}`` of one listing of ``directory`` (its direct files)."""
    prefix = directory.rstrip("/") + "/"
    found = FileSystems.match([escape_glob(prefix) + "*"])[0].metadata_list
    return {m.path[len(prefix):]: m.size_in_bytes for m in found if "/" not in m.path[len(prefix):]}


def _describe(output: str, version: str, directory: str, request: dict, funnel: dict, report: dict,
              replaces: Optional[str]) -> bytes:
    """Writes the version's own metadata and manifest; returns the commit object's bytes."""
    name, dataset_version = request["name"], request["dataset_version"]
    lengths = shard_report.lengths(report)
    split_bytes = {split: sum(entry["bytes"]) for split, entry in report.items()}
    features = tfds_metadata.features_json(request.get("carried", ()), request.get("concepts", False))
    line = conservation_line(funnel)
    description = f"{request['description']}; {line}"
    _write(FileSystems.join(directory, "features.json"), features)
    _write(FileSystems.join(directory, corpus_dir.COMMIT),
           tfds_metadata.dataset_info_json(name, lengths, split_bytes, description, dataset_version))
    manifest = {
        "version": version, "dataset": name, "dataset_version": dataset_version, "built_by": "pipeline.build",
        "started": request.get("started"), "replaces": replaces, "conservation": line,
        "funnel": {key: funnel.get(key) for key in ("input", "written", "rejected_total", "conserved")},
        "shards": {split: report[split] for split in sorted(report)},
        "candidates": _read_json(FileSystems.join(directory, candidate_counts.SUMMARY_FILE),
                                 candidate_counts.summary_schema),
        "webdataset": _read_json(FileSystems.join(directory, TARS_FILE), tars_schema) if request.get("webdataset")
        else None,
    }
    _write(FileSystems.join(directory, corpus_dir.MANIFEST), json.dumps(manifest, sort_keys=True) + "\n")
    return tfds_metadata.dataset_info_json(
        name, lengths, split_bytes, f"{description}; version {version}", dataset_version,
        directory=f"{corpus_dir.VERSIONS}/{version}", features=features).encode("utf-8")


def _write_top_features(output: str, directory: str) -> None:
    with FileSystems.open(FileSystems.join(directory, "features.json")) as handle:
        _write(FileSystems.join(output, "features.json"), handle.read().decode("utf-8"))


def _conflict(output: str, version: str) -> str:
    _, now = current(output)
    holds = f"versions/{now}" if now else "a plain-layout corpus"
    return (f"another build committed to {output} after this one started (it now holds {holds}); this build's "
            f"version {version} is complete and untouched: 'python -m pipeline.publish {output} --build "
            f"{version} --replace' commits it")


def publish(output: str, version: Optional[str] = None, replace: bool = False,
            keep_previous: Optional[bool] = None) -> Published:
    """Publish build ``version`` of ``output`` (default: the newest); see the module's steps.

    ``replace``: commit even if another build committed since this one
    started (that version is then the one replaced). Raises
    ``PublishError``/``AccountingError`` (nothing committed) or
    ``commit.CommitConflict``.
    """
    output = output.rstrip("/")
    committed, now = current(output)
    version = version or choose_version(output, now)
    if not corpus_dir.VERSION_ID.match(version):
        raise PublishError(f"--build {version!r} is not a build's id (e.g. 20250101T120000Z-0123abcd)")
    directory = corpus_dir.version_dir(output, version)
    request = _read_json(FileSystems.join(directory, output_lib.REQUEST), request_schema)
    if request is None:
        raise PublishError(f"{directory} is not a build of pipeline.build (no {output_lib.REQUEST})")
    keep = request.get("keep_previous", False) if keep_previous is None else keep_previous
    if now == version:
        _write_top_features(output, directory)
        manifest = _read_json(FileSystems.join(directory, corpus_dir.MANIFEST), manifest_schema) or {}
        funnel = _read_json(FileSystems.join(directory, "stats", FUNNEL_FILE), funnel_schema) or {}
        replaced, already = manifest.get("replaces"), True
    else:
        funnel, report = _check(output, version, directory, request)
        expected = committed.token if replace else request["expects"]
        if expected != committed.token:
            raise commit_lib.CommitConflict(_conflict(output, version))
        replaced = now
        data = _describe(output, version, directory, request, funnel, report, replaced)
        # TFDS's by-name lookup (tfds.builder(NAME, data_dir=...), big_vision's way) needs a features.json
        # beside the commit; the commit carries its features, so the file's content is read only by a
        # plain-layout corpus's dataset_info.json: that one's is replaced after the commit, not before.
        if now != "":
            _write_top_features(output, directory)
        try:
            commit_lib.write(output, data, expected)
        except commit_lib.CommitConflict:
            raise commit_lib.CommitConflict(_conflict(output, version)) from None
        if now == "":
            _write_top_features(output, directory)
        already = False
    deleted = downloads_deleted = 0
    if request.get("download") and not request.get("keep_downloads"):
        downloads = FileSystems.join(output, output_lib.DOWNLOADS)
        consumed = output_lib.consumed_downloads(
            [f"{output_lib.DOWNLOADS}/{f}" for f in output_lib.list_files(downloads)], version)
        output_lib.delete_files(output, consumed)
        downloads_deleted = len(consumed)
    if replaced is not None and not keep:
        if replaced:  # one version: list its directory only, not the new one's shards too
            prefix = f"{corpus_dir.VERSIONS}/{replaced}/"
            files = [prefix + f for f in output_lib.list_files(corpus_dir.version_dir(output, replaced))]
        else:
            files = output_lib.list_files(output)
        doomed = output_lib.replaced_files(files, request["name"], replaced)
        unlinked = output_lib.delete_files(output, doomed)
        deleted = sum(1 for f in doomed if not FileSystems.join(output, f).startswith(tuple(l + "/" for l in unlinked)))
    else:
        unlinked = []
    return Published(version, directory, funnel, already, replaced, deleted, downloads_deleted, unlinked)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="python -m pipeline.publish", allow_abbrev=False,
        description="Publish a build whose job has finished (e.g. launched with --detached): check it, commit it, "
                    "remove the corpus it replaces. Safe to run again.")
    parser.add_argument("output", help="the build's --output (local or gs://)")
    parser.add_argument("--build", dest="version", default=None, metavar="ID",
                        help="the build to publish, a directory name under OUTPUT/versions/ (default: the newest)")
    parser.add_argument("--replace", action="store_true",
                        help="commit even though another build committed after this one started")
    parser.add_argument("--keep_previous", action="store_true", default=None,
                        help="keep the files of the corpus this one replaces (default: as the build said)")
    return parser


def report_lines(result: Published) -> List[str]:
    lines = []
    if result.already:
        lines.append(f"{result.version} was already committed")
    if result.replaced is not None:
        what = f"versions/{result.replaced}" if result.replaced else "the plain-layout corpus"
        lines.append(f"replaced {what}: " + (f"{result.deleted:,} files deleted" if result.deleted else "kept"))
    for link in result.unlinked:
        lines.append(f"{link} is a symbolic link to a directory elsewhere: the link was removed, not the files "
                     "it leads to")
    if result.downloads_deleted:
        lines.append(f"downloads: {result.downloads_deleted:,} staging files deleted (what they held is in the "
                     "shards or the rejection ledger)")
    return lines


def main(argv: Optional[List[str]] = None) -> None:
    from common import console

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    console.route_library_output("publish", None)
    try:
        result = publish(args.output, args.version, args.replace, args.keep_previous)
    except PublishError as error:
        console.error(str(error))
        sys.exit(EXIT_USAGE)
    except AccountingError as error:
        console.error(f"{error}; not committed")
        sys.exit(EXIT_FAILED)
    except commit_lib.CommitConflict as error:
        console.error(str(error))
        sys.exit(EXIT_CONFLICT)
    print(format_funnel(result.funnel), flush=True)
    for line in report_lines(result):
        print(line, flush=True)
    total = sum(as_int(v) for v in (result.funnel.get("written") or {}).values())
    print(f"corpus: {args.output.rstrip('/')} (version {result.version}, {total:,} records, committed)", flush=True)

