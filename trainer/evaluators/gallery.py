"""A page a person can look at: what the model retrieves for held-out queries.

Writes one self-contained HTML file (thumbnails inline as ``data:`` URIs, no
scripts, no external files): for a few held-out captions the top retrieved
images, and for a few held-out images the top captions, with the true
partner of each query marked. Candidates are the whole split (unique images
by sha256, unique captions by token ids, as in ``retrieval``), so the page
shows the same ranking the R@k numbers count. Thumbnails are the eval
crops the model saw (``image_size`` pixels), scaled up for viewing.

Queries are spread evenly over the split's unique captions/images (file
order), so the page shows the same examples at every step of a run.
"""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Callable, Optional

import numpy as np

from trainer.evaluators import chunks, encode_in_batches
from trainer.evaluators.retrieval import _groups

PAGE_NAME = "retrieval.html"


def _png_data_uri(image: np.ndarray) -> str:
    """float [-1, 1] HxWx3 -> ``data:image/png;base64,...``."""
    from PIL import Image

    pixels = np.clip(np.round((np.asarray(image) + 1.0) * 127.5), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def spread(count: int, n: int) -> np.ndarray:
    """``n`` indices spread evenly over ``range(count)`` (all of them if ``n >= count``)."""
    if n >= count:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, n).round().astype(int))


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; } td { padding: 4px 8px; vertical-align: middle; }
tr { border-bottom: 1px solid #ddd; }
img { width: 96px; height: 96px; image-rendering: pixelated; border: 3px solid transparent; }
img.hit { border-color: #2a2; } li.hit { color: #2a2; font-weight: bold; }
.query { max-width: 22em; } .score { color: #888; font-size: 0.8em; }
ol { margin: 0; padding-left: 1.4em; }
"""


def render_page(*, title: str, summary: str, text_queries: list, image_queries: list) -> str:
    """The HTML. ``text_queries``: (caption, [(data_uri, score, is_true_image)]);
    ``image_queries``: (data_uri, [(caption, score, is_true_caption)])."""
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           f"<style>{_STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
           f"<p>{html.escape(summary)} A green frame or bold line marks the query's true partner.</p>",
           "<h2>Text &rarr; image: held-out captions and their top images</h2><table>"]
    for caption, hits in text_queries:
        cells = "".join(
            f"<img src='{uri}' class='{'hit' if true else ''}' title='score {score:.3f}'"
            f" alt='rank {rank + 1}{' (true image)' if true else ''}'>"
            for rank, (uri, score, true) in enumerate(hits))
        out.append(f"<tr class='text-query'><td class='query'>{html.escape(caption)}</td><td>{cells}</td></tr>")
    out.append("</table><h2>Image &rarr; text: held-out images and their top captions</h2><table>")
    for uri, hits in image_queries:
        items = "".join(
            f"<li class='{'hit' if true else ''}'>{html.escape(caption)} "
            f"<span class='score'>{score:.3f}</span></li>" for caption, score, true in hits)
        out.append(f"<tr class='image-query'><td><img src='{uri}' alt='query image'></td>"
                   f"<td><ol>{items}</ol></td></tr>")
    out.append("</table></body></html>\n")
    return "\n".join(out)


class GalleryEvaluator:
    """Writes ``<workdir>/retrieval.html`` (or ``output``); reports how many queries it shows.

    kwargs: ``data_dir``, ``workdir``, ``image_size``, ``tokenizer``,
    ``batch_size``; optional ``split`` ("validation"), ``num_queries`` (8 per
    direction), ``top_k`` (5), ``max_pairs`` (bounds the candidates),
    ``resize_size``, ``output``.
    """

    def __init__(self, data_dir: str, *, workdir: str, image_size: int, tokenizer, batch_size: int = 64,
                 split: str = "validation", num_queries: int = 8, top_k: int = 5,
                 max_pairs: Optional[int] = 2000, resize_size: Optional[int] = None,
                 output: Optional[str] = None):
        self.data_dir, self.split = data_dir, split
        self.image_size, self.resize_size = image_size, resize_size
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.num_queries, self.top_k, self.max_pairs = num_queries, top_k, max_pairs
        self.output = output or os.path.join(workdir, PAGE_NAME)

    def _pairs(self):
        """(images [N, S, S, 3], token rows [N, L], captions [N] str, sha256 [N]) in file order."""
        from trainer import input_pipeline

        dataset = input_pipeline.make_dataset(
            self.data_dir, self.split, global_batch_size=self.batch_size, image_size=self.image_size,
            resize_size=self.resize_size, train=False, seed=0, tokenizer=self.tokenizer,
            process_index=0, process_count=1, extra_features=("sha256", "texts"))
        if self.max_pairs is not None:
            dataset = dataset.unbatch().take(self.max_pairs).batch(self.batch_size)
        images, tokens, captions, sha256s = [], [], [], []
        for batch in dataset.as_numpy_iterator():
            images.append(batch["image"])
            tokens.append(batch["text"])
            captions += [t.decode("utf-8", "replace") for t in batch["texts"]]
            sha256s += [s.decode() if isinstance(s, bytes) else str(s) for s in batch["sha256"]]
        return np.concatenate(images), np.concatenate(tokens), captions, sha256s

    def run(self, encode_images: Callable, encode_texts: Callable) -> dict:
        import jax
        import tensorflow as tf

        images, tokens, captions, sha256s = self._pairs()
        image_group, image_first = _groups(sha256s)
        caption_group, caption_first = _groups([row.tobytes() for row in tokens])
        zimg = encode_in_batches(encode_images, chunks(images[image_first], self.batch_size), self.batch_size)
        ztxt = encode_in_batches(encode_texts, chunks(tokens[caption_first], self.batch_size), self.batch_size)
        scores = zimg @ ztxt.T  # [unique images, unique captions]
        positive = np.zeros(scores.shape, dtype=bool)
        positive[image_group, caption_group] = True
        thumbnails = {}

        def thumbnail(i):
            if i not in thumbnails:
                thumbnails[i] = _png_data_uri(images[image_first[i]])
            return thumbnails[i]

        k = self.top_k
        text_queries = []
        for c in spread(len(caption_first), self.num_queries):
            top = np.argsort(-scores[:, c], kind="stable")[:k]
            text_queries.append((captions[caption_first[c]],
                                 [(thumbnail(i), float(scores[i, c]), bool(positive[i, c])) for i in top]))
        image_queries = []
        for i in spread(len(image_first), self.num_queries):
            top = np.argsort(-scores[i], kind="stable")[:k]
            image_queries.append((thumbnail(i), [(captions[caption_first[c]], float(scores[i, c]),
                                                  bool(positive[i, c])) for c in top]))
        page = render_page(
            title=f"Held-out retrieval: {self.split} split of {self.data_dir}",
            summary=f"Candidates: {len(image_first)} unique images and {len(caption_first)} unique "
                    f"captions; each query shows its top {k}.",
            text_queries=text_queries, image_queries=image_queries)
        if jax.process_index() == 0:  # every process computes (the encoders are collective), one writes
            tf.io.gfile.makedirs(os.path.dirname(self.output) or ".")
            with tf.io.gfile.GFile(self.output, "w") as f:
                f.write(page)
        return {"text_queries": float(len(text_queries)), "image_queries": float(len(image_queries))}
