"""``DownloadImages``: the first pass over URL-list rows, each distinct URL fetched and judged once.

    URL-list rows (Candidates without bytes)
      -> UrlRows -> (url, needs) per row --DistinctUrls (a combine per URL)--> (url, needs)
      -> PlanDownloads: joined with the complete indexes of OUTPUT/_downloads/   [resume]
           to fetch -> Crawl: routed by host, fetched politely, staged, judged   [crawl]
           staged   -> JudgeStaged: read back from the staging file, judged      [resume]
           settled  -> an earlier build's failure that is the URL's answer
      -> ImageFactsRow per distinct URL
      -> JudgeRows: the facts joined back to every row of the URL, each row judged   [fanout]
         (and, with --model_score, each kept pair scored, its image read back from the staging file)
      -> LightRow per row (+ measures, pairs, embeddings, NSFW outcomes), as ``pipeline.stages.judge``'s

No image bytes cross a shuffle: URLs and light facts do; the bytes go from
the socket to a staging file and to the image judge in one DoFn, and the
second pass (``pipeline.write.second_pass``) reads them from the staging file.

Every URL-list row becomes one light row: its ``download/<reason>``
rejection, or the record judged from its image's facts. The funnel's note
on the download stage says what bounded the crawl and how many distinct
URLs were fetched, failed, and reused from earlier builds' staging files.
"""

from __future__ import annotations

import apache_beam as beam

from filters.record import row_needs
from pipeline.download import crawl, fanout, resume
from pipeline.download.image_facts import ImageJudge, UrlRow, candidate_of, url_row
from pipeline.download.settings import DownloadOptions, describe
from pipeline.stages.judge import EMBEDDINGS, MEASURES, NSFW_OUTCOMES, PAIRS, ROWS

NOTES = "notes"


def _or(needs):
    found = 0
    for value in needs:
        found |= value
    return found


class DownloadImages(beam.PTransform):
    """URL-list rows -> ``{"rows", "measures", "pairs", "embeddings", "nsfw", "notes"}`` (see the module's docstring).

    ``record_judge``: the first pass's ``pipeline.stages.judge.RecordJudge`` (its
    preset, extra stages, NSFW scorer, embedder and evaluation index).
    ``staging_dir``: ``OUTPUT/_downloads``; ``build_id`` names this build's
    staging files. ``lookup``: a test's DNS lookup (None: the system's).
    """

    decides = ("download",)

    def __init__(self, record_judge, staging_dir: str, build_id: str, options: DownloadOptions = DownloadOptions(),
                 lookup=None, max_record_bytes=None):
        super().__init__()
        self.record_judge = record_judge
        self.staging_dir = staging_dir
        self.build_id = build_id
        self.options = options
        self.lookup = lookup
        self.max_record_bytes = max_record_bytes
        self.notes = {"download": describe(options)}

    def expand(self, to_fetch):
        preset, options = self.record_judge.preset, self.options
        extras = self.record_judge.extras  # the per-record ones
        image_judge = ImageJudge(self.record_judge)
        url_rows = to_fetch | "UrlRows" >> beam.Map(url_row).with_output_types(UrlRow)
        distinct = (
            url_rows
            | "RowNeeds" >> beam.Map(lambda row: (row.url, row_needs(candidate_of(row), preset)))
            | "DistinctUrls" >> beam.CombinePerKey(_or)
        )
        plan = distinct | "PlanDownloads" >> resume.PlanDownloads(self.staging_dir, options.refetch)
        staged = plan[resume.STAGED] | "JudgeStaged" >> resume.JudgeStaged(image_judge, self.max_record_bytes)
        fetched = (
            (plan[resume.TO_FETCH], staged[resume.TO_FETCH])
            | "UrlsToFetch" >> beam.Flatten()
            | "Crawl" >> crawl.Crawl(options, self.staging_dir, self.build_id, image_judge, self.lookup)
        )
        facts = (fetched, staged["facts"], plan[resume.SETTLED]) | "FactsPerUrl" >> beam.Flatten()
        judged = {"rows": url_rows, "facts": facts} | "JudgeRows" >> fanout.JudgeRows(
            preset, extras, self.max_record_bytes, self.record_judge.scorer)
        notes = facts | "DownloadNote" >> fanout.DownloadNote(describe(options))
        return {**{tag: judged[tag] for tag in (ROWS, MEASURES, PAIRS, EMBEDDINGS, NSFW_OUTCOMES)}, NOTES: notes}
