"""``--reuse OLD``: what a rebuild may take from a previous committed build, decided once, before the job.

    python -m pipeline.build --input ... --output NEW --set min_words=2 --reuse OLD

A rebuild writes exactly the corpus a full build with the same arguments
writes; it only takes from OLD's candidate table the facts a full build
would derive again at a cost (``pipeline.readers.previous_build``: the
reduced decode's pHash, the NSFW score, an evaluation search that found
nothing, the stored picture). Every rule is applied again under this
build's thresholds, and the corpus-wide stages run on every row as in any
build. What decides which facts still hold:

- the pHash and the sha256: always (a function of the bytes, checked per record);
- NSFW scores: where the worker's scorer is one that scored OLD (the model
  and its precision, as OLD's funnel names them); otherwise scored again;
- evaluation matches: where the evaluation index is OLD's (the same
  embedded sets, embedder, threshold and search); otherwise searched again;
- stored pictures: where ``output_max_side`` and ``output_jpeg_quality``
  are OLD's; otherwise made again;
- the pair model's score (``--model_score``) and in-corpus embeddings are
  not in the table: computed again.

Refused in one line (exit 2): OLD is not a committed corpus, has no table,
was built by another version of the facts (``FACTS_VERSION``), read
downloads (``--download``: its staging files are gone), or this build
downloads.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from common import corpus_dir
from pipeline.build.options import UsageError
from pipeline.funnel.candidate_counts import SUMMARY_FILE
from pipeline.publish import output_contract
from pipeline.readers.previous_build import FACTS_VERSION, PreviousBuild
from pipeline.stages.judge import RECORD_STAGES

#: The options whose values the stored picture is made with.
PICTURE_OPTIONS = ("output_max_side", "output_jpeg_quality")


def facts_record(config, eval_digest: Optional[str]) -> dict:
    """What a build records of its facts in ``_BUILD.json``, for a later ``--reuse`` of it."""
    return {"version": FACTS_VERSION, "eval_index": eval_digest}


def _read_json(path: str) -> Optional[dict]:
    try:
        with FileSystems.open(path) as handle:
            return json.loads(handle.read())
    except Exception:  # missing or damaged: the caller says what is missing
        return None


def _scorers(funnel: dict, new_model: str) -> tuple:
    """The scorer labels OLD's NSFW note names, when it ran the same model; () reuses no NSFW score."""
    if funnel.get("preset", {}).get("nsfw_model") != new_model:
        return ()
    note = next((stage.get("note") or "" for stage in funnel.get("stages", []) if stage.get("stage") == "nsfw"), "")
    found = re.search(r"scored by (.+?), rejected if", note)
    return tuple(label.strip() for label in found.group(1).split(", ")) if found else ()


def _first_pass_stages(funnel: dict) -> tuple:
    """OLD's stages up to its NSFW stage: a row they rejected was never searched against the evaluation index."""
    names = [stage.get("stage") for stage in funnel.get("stages", [])]
    if "nsfw" in names:
        return tuple(names[:names.index("nsfw") + 1])
    return ("read",) + RECORD_STAGES + ("nsfw",)


def _table_files(version: str, summary: dict) -> tuple:
    """``(source, table file)`` of every readable table file of OLD (an unreadable one answers for nothing:
    its records are judged as new)."""
    found = []
    for relative in sorted(summary.get("files", {})):
        path = FileSystems.join(version, relative)
        try:
            with FileSystems.open(path) as handle:
                sources = pq.read_table(pa.BufferReader(handle.read()), columns=["source"]).column("source")
        except Exception:
            continue
        for source in sorted({s for s in sources.to_pylist() if s}):
            found.append((source, path))
    return tuple(found)


def resolve_previous(config, eval_digest: Optional[str]) -> Optional[PreviousBuild]:
    """``--reuse``'s ``PreviousBuild`` for ``config`` (None without it), or ``UsageError`` in one line."""
    old = config.flags.reuse
    if not old:
        return None
    if config.download is not None:
        raise UsageError("--reuse with --download: a rebuild reuses the facts of records read from files; "
                         "build without --download, or without --reuse")
    path = old.rstrip("/") if "://" in old else old
    if "://" not in path and not FileSystems.exists(path):
        raise UsageError(f"--reuse {old}: no such directory")
    try:
        version = corpus_dir.resolve(path, flag=None)
    except corpus_dir.IncompleteCorpus:
        raise UsageError(f"--reuse {old}: not a committed corpus of pipeline.build") from None
    if version.rstrip("/") == config.version_dir.rstrip("/"):
        raise UsageError(f"--reuse {old}: that is this build's own version")
    request = _read_json(FileSystems.join(version, output_contract.REQUEST))
    funnel = _read_json(FileSystems.join(version, "stats", "funnel.json"))
    if request is None or funnel is None:
        raise UsageError(f"--reuse {old}: not a committed corpus of pipeline.build (no _BUILD.json or funnel)")
    facts = request.get("facts") or {}
    if facts.get("version") != FACTS_VERSION:
        raise UsageError(f"--reuse {old}: built by a version of pipeline.build whose facts are not this one's "
                         f"(facts version {facts.get('version')}, this is {FACTS_VERSION}); build it again "
                         "without --reuse")
    if request.get("download"):
        raise UsageError(f"--reuse {old}: a build with --download; the downloads its table points at are gone")
    summary = _read_json(FileSystems.join(version, SUMMARY_FILE))
    if summary is None:
        raise UsageError(f"--reuse {old}: its candidate table is missing or damaged ({SUMMARY_FILE})")
    old_preset, new_preset = funnel.get("preset", {}), config.preset._by_name()
    return PreviousBuild(
        version_dir=version,
        tables=_table_files(version, summary),
        nsfw_scorers=_scorers(funnel, config.preset.nsfw_model),
        eval_matches=eval_digest is not None and facts.get("eval_index") == eval_digest,
        stored_pictures=all(old_preset.get(name) == new_preset.get(name) for name in PICTURE_OPTIONS),
        first_pass_stages=_first_pass_stages(funnel),
    )


def with_previous(config, eval_digest: Optional[str]):
    """``config`` with its ``previous`` resolved."""
    return dataclasses.replace(config, previous=resolve_previous(config, eval_digest))


def launcher_note(previous: PreviousBuild, config) -> str:
    """What the funnel says before the workers count: which facts this rebuild takes from OLD."""
    again = []
    if not previous.nsfw_scorers and config.preset.nsfw_threshold < 1.0:
        again.append("NSFW scores (the old build scored with another model or none)")
    if config.eval_sets and not previous.eval_matches:
        again.append("evaluation matches (the evaluation index differs)")
    if not previous.stored_pictures:
        again.append("stored pictures (output_max_side or output_jpeg_quality differs)")
    if config.scorer is not None:
        again.append("pair-model scores (not kept in the table)")
    said = f"facts reused from {previous.version_dir}"
    return f"{said}; derived again: {', '.join(again)}" if again else said
