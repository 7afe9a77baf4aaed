r"""Cross-modal search over an exported embedding set (``trainer.embed``), as in ALIGN's Figure 4.

    python -m trainer.search out/embeddings --text "a red star on a white background"
    python -m trainer.search out/embeddings --image query.jpg              # image -> texts
    python -m trainer.search out/embeddings --image query.jpg --text "blue" # image+text -> images

Three kinds of query, embedded with the model the set was exported with
(its workdir and step are in ``embeddings.json``; ``--workdir`` / ``--step``
override them):

* ``--text``: text -> images, the images whose embedding is closest;
* ``--image``: image -> texts, the closest captions (distinct captions);
* ``--image`` with ``--text``: image+text -> images; the query embedding is
  the normalised sum of the image's and the text's embeddings (ALIGN's
  "image + text" queries, e.g. a picture of a red circle plus "blue").

Several ``--text`` give several text queries; ``--image`` and ``--text``
given together pair up in order. Each result is printed (rank, cosine
score, key, caption) and written to one self-contained HTML page
(``--html``, default ``search.html``: thumbnails inline as ``data:`` URIs,
no script, nothing fetched).

Index: faiss inner product (cosine: the embeddings are L2-normalised). An
exact ``IndexFlatIP`` up to ``--ivf_threshold`` candidates (default 50,000),
above it an inverted-file index (``IndexIVFFlat``, ~4 sqrt(N) lists,
``--nprobe`` of them searched), which trades a little recall for speed.
"""

from __future__ import annotations

import base64
import html
import math
import os
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from common import cli
from common.vectors import l2_normalize

IVF_THRESHOLD = 50_000
DEFAULT_NPROBE = 16


@dataclass
class Query:
    text: Optional[str] = None
    image_path: Optional[str] = None

    @property
    def kind(self) -> str:
        if self.image_path and self.text:
            return "image+text -> images"
        return "image -> texts" if self.image_path else "text -> images"

    @property
    def target(self) -> str:
        return "texts" if self.kind == "image -> texts" else "images"


class Index:
    """faiss over one set of candidate vectors: exact below ``ivf_threshold``, IVF above it."""

    def __init__(self, vectors: np.ndarray, *, ivf_threshold: int = IVF_THRESHOLD,
                 nprobe: int = DEFAULT_NPROBE, seed: int = 0):
        import faiss

        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        n, dim = vectors.shape
        if n == 0:
            raise ValueError("no candidates to search")
        if n <= ivf_threshold:
            self.index, self.description = faiss.IndexFlatIP(dim), f"exact search over {n:,}"
        else:
            nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))  # faiss wants >= 39 points per list
            quantizer = faiss.IndexFlatIP(dim)
            self.index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
            self.index.cp.seed = seed
            self.index.train(vectors)
            self.index.nprobe = min(nprobe, nlist)
            self.quantizer = quantizer  # the IVF index does not own it
            self.description = f"inverted-file search over {n:,} ({nlist} lists, {self.index.nprobe} probed)"
        self.index.add(vectors)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, row ids) ``[Q, k]``, best first; missing results have id -1."""
        scores, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return scores, ids


def query_embeddings(queries: Sequence[Query], encoders) -> np.ndarray:
    """``[Q, D]``: text, image, or the normalised sum of both."""
    from trainer.evaluators import encode_image_files

    out = []
    for query in queries:
        parts = []
        if query.image_path:
            parts.append(encode_image_files(encoders.encode_images, [query.image_path],
                                            image_size=encoders.image_size,
                                            resize_size=encoders.resize_size, batch_size=1)[0])
        if query.text:
            parts.append(encoders.encode_texts(encoders.tokenizer.tokenize_numpy([query.text]))[0])
        out.append(l2_normalize(np.sum(parts, axis=0)))
    return np.stack(out)


class Candidates:
    """The searchable side of an export: images (rows with an image) or texts (distinct captions)."""

    def __init__(self, table, target: str, **index_options):
        column = "image_embedding" if target == "images" else "text_embedding"
        present = np.flatnonzero(table.column(column).is_valid().to_numpy(zero_copy_only=False))
        if target == "texts":  # one candidate per distinct caption: the first row that has it
            captions = table.column("caption").to_pylist()
            first = {}
            for row in present:
                first.setdefault(captions[row], row)
            present = np.asarray(sorted(first.values()), dtype=np.int64)
        if not len(present):
            raise ValueError(f"the embedding set has no {target} to search")
        self.rows = present
        vectors = table.column(column).take(present).combine_chunks()
        self.vectors = vectors.flatten().to_numpy().reshape(len(present), -1)
        self.index = Index(self.vectors, **index_options)


def search(table, queries: Sequence[Query], embeddings: np.ndarray, k: int, **index_options) -> list:
    """For each query, its top ``k`` as dicts (rank, score, row, key, caption, label, thumbnail)."""
    by_target = {}
    results = []
    for query, embedding in zip(queries, embeddings):
        if query.target not in by_target:
            by_target[query.target] = Candidates(table, query.target, **index_options)
        candidates = by_target[query.target]
        scores, ids = candidates.index.search(embedding[None], k)
        hits = []
        for score, i in zip(scores[0], ids[0]):
            if i < 0:
                continue
            row = int(candidates.rows[i])
            hits.append({"rank": len(hits) + 1, "score": float(score), "row": row,
                         "key": table.column("key")[row].as_py(),
                         "caption": table.column("caption")[row].as_py(),
                         "label": table.column("label")[row].as_py(),
                         "thumbnail": table.column("thumbnail")[row].as_py()})
        results.append({"query": query, "index": candidates.index.description, "hits": hits})
    return results


def _data_uri(jpeg: Optional[bytes]) -> Optional[str]:
    return None if jpeg is None else "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin: 1.6em 0 0.4em; }
.query img { width: 128px; border: 1px solid #999; } .query { margin-bottom: 0.5em; }
.hits { display: flex; flex-wrap: wrap; gap: 10px; }
figure { margin: 0; width: 140px; font-size: 0.8em; }
figure img { width: 128px; height: 128px; object-fit: contain; background: #eee; display: block; }
figcaption .score, .texts .score { color: #777; } .key { color: #999; word-break: break-all; }
ol.texts li { margin: 0.2em 0; }
"""


def render_page(results: list, *, title: str, subtitle: str) -> str:
    """One self-contained page: every query with its ranked results."""
    esc = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
           f"<style>{_STYLE}</style></head><body><h1>{esc(title)}</h1><p>{esc(subtitle)}</p>"]
    for number, result in enumerate(results, start=1):
        query = result["query"]
        out.append(f"<section class='result' data-kind='{esc(query.kind)}'>"
                   f"<h2>Query {number}: {esc(query.kind)}</h2><div class='query'>")
        if query.image_path:
            from trainer.embed import thumbnail

            with open(query.image_path, "rb") as f:
                out.append(f"<img src='{_data_uri(thumbnail(f.read()))}' alt='query image'>")
        if query.text:
            out.append(f"<p class='query-text'>&ldquo;{esc(query.text)}&rdquo;</p>")
        out.append(f"</div><p class='key'>{esc(result['index'])}</p>")
        if query.target == "images":
            out.append("<div class='hits'>")
            for hit in result["hits"]:
                label = f"<br>{esc(hit['label'])}" if hit["label"] else ""
                caption = f"<br>{esc(hit['caption'])}" if hit["caption"] else ""
                out.append(f"<figure class='hit'><img src='{_data_uri(hit['thumbnail'])}' "
                           f"alt='rank {hit['rank']}'><figcaption>{hit['rank']}. "
                           f"<span class='score'>{hit['score']:.3f}</span>{label}{caption}"
                           f"<br><span class='key'>{esc(hit['key'])}</span></figcaption></figure>")
            out.append("</div>")
        else:
            out.append("<ol class='texts'>")
            for hit in result["hits"]:
                out.append(f"<li class='hit'>{esc(hit['caption'])} <span class='score'>{hit['score']:.3f}</span> "
                           f"<span class='key'>{esc(hit['key'])}</span></li>")
            out.append("</ol>")
        out.append("</section>")
    out.append("</body></html>\n")
    return "\n".join(out)


def format_results(results: list) -> str:
    lines = []
    for result in results:
        query = result["query"]
        shown = " + ".join(filter(None, [query.image_path, query.text and f'"{query.text}"']))
        lines.append(f"{query.kind}: {shown} ({result['index']})")
        for hit in result["hits"]:
            what = hit["caption"] if query.target == "texts" else " ".join(
                filter(None, [hit["label"] and f"[{hit['label']}]", hit["caption"]]))
            lines.append(f"  {hit['rank']:>2}  {hit['score']:.4f}  {hit['key']}  {what or ''}".rstrip())
    return "\n".join(lines)


def make_queries(texts: Sequence[str], images: Sequence[str]) -> list:
    from trainer.eval_data import EvalDataError

    for path in images:
        if not os.path.isfile(path):
            raise EvalDataError(f"{path}: no such query image")
    if texts and images:
        if len(texts) != len(images):
            raise EvalDataError(f"{len(images)} --image and {len(texts)} --text: give them in pairs "
                                "(image+text queries) or only one kind")
        return [Query(text=t, image_path=i) for t, i in zip(texts, images)]
    return [Query(text=t) for t in texts] + [Query(image_path=i) for i in images]


def run(embeddings_dir: str, queries: Sequence[Query], *, k: int = 5, workdir: Optional[str] = None,
        step: Optional[int] = None, html_path: Optional[str] = None, encoders=None,
        **index_options) -> list:
    """Loads the export and the model, searches, writes the page; returns the results."""
    from trainer import checkpoint
    from trainer.embed import read_embeddings

    table, manifest = read_embeddings(embeddings_dir)
    if encoders is None:
        encoders = checkpoint.Encoders(workdir or manifest["workdir"],
                                       step if step is not None else manifest["step"] if not workdir else None)
    if encoders.config.model.embed_dim != manifest["embed_dim"]:
        raise ValueError(f"the model embeds into {encoders.config.model.embed_dim} dimensions, the set "
                         f"into {manifest['embed_dim']}: search with the model it was exported with")
    results = search(table, queries, query_embeddings(queries, encoders), k, **index_options)
    if html_path:
        page = render_page(results, title=f"Search in {embeddings_dir}",
                           subtitle=f"{manifest['num_rows']:,} rows from {manifest['source']['path']}; "
                                    f"model {encoders.workdir} at step {encoders.step}; top {k} by cosine.")
        os.makedirs(os.path.dirname(os.path.abspath(html_path)), exist_ok=True)
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(page)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli.ArgumentParser(prog="python -m trainer.search",
                                     description="Search an exported embedding set (see the module docstring).")
    parser.add_argument("embeddings", help="a trainer.embed output directory")
    parser.add_argument("--text", action="append", default=[], help="a text query (repeatable)")
    parser.add_argument("--image", action="append", default=[], help="an image query (repeatable)")
    parser.add_argument("--k", type=int, default=5, help="results per query (default 5)")
    parser.add_argument("--html", default="search.html", help="result page (default search.html)")
    parser.add_argument("--workdir", default=None, help="model workdir (default: the export's)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the export's)")
    parser.add_argument("--ivf_threshold", type=int, default=IVF_THRESHOLD,
                        help="candidates above which an inverted-file index is used")
    parser.add_argument("--nprobe", type=int, default=DEFAULT_NPROBE, help="IVF lists searched per query")
    args = parser.parse_args(argv)
    if not args.text and not args.image:
        parser.exit(2, "error: give at least one --text or --image query\n")

    from common import console

    log = console.route_library_output("search") if argv is None else "the log"
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
        queries = make_queries(args.text, args.image)
        results = run(args.embeddings, queries, k=args.k, workdir=args.workdir, step=args.step,
                      html_path=args.html, ivf_threshold=args.ivf_threshold, nprobe=args.nprobe)
    except Exception as error:
        from common.state_files import DamagedFile
        from trainer.checkpoint import DamagedCheckpoint
        from trainer.eval_data import EvalDataError

        if isinstance(error, DamagedCheckpoint):  # one line naming the workdir and the step
            parser.exit(2, f"error: {error}\n")
        return console.failure(error, "search", log,
                               expected=(EvalDataError, FileNotFoundError, ValueError, DamagedFile))
    print(format_results(results))
    print(f"page: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
