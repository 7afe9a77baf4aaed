"""Image<->text retrieval on a Karpathy-split set (Flickr30K, MSCOCO): R@1/5/10 both ways.

The standard protocol of ALIGN's Table 1 (and CLIP's, and every retrieval
paper since Karpathy & Fei-Fei 2015): the ``test`` split, several captions
per image (Flickr30K's 1K test images have 5 each). Image->text: each image
is a query over all captions, a hit at ``k`` when *any* of its captions is
among the top ``k``. Text->image: each caption is a query of its own (5K
queries), a hit when its image is among the top ``k``. Captions are not
merged even when two read alike: the protocol counts every caption.

The metric is ``retrieval.retrieval_metrics`` (ties count against the
query; chance levels reported alongside), fed one pair per caption.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from trainer.evaluators import chunks, encode_image_files, encode_in_batches
from trainer.evaluators.retrieval import KS, retrieval_metrics


def captioned_retrieval_metrics(image_embeddings: np.ndarray, caption_embeddings: np.ndarray,
                                image_of_caption: np.ndarray, ks: Sequence[int] = KS) -> dict:
    """Metrics for images with several captions each: caption ``j`` describes image ``image_of_caption[j]``."""
    image_of_caption = np.asarray(image_of_caption)
    if len(np.unique(image_of_caption)) != len(image_embeddings):
        raise ValueError("every image needs at least one caption")
    return retrieval_metrics(np.asarray(image_embeddings)[image_of_caption], caption_embeddings,
                             image_ids=image_of_caption.tolist(),
                             caption_ids=range(len(image_of_caption)), ks=ks)


class KarpathyRetrievalEvaluator:
    """kwargs: ``captions_file`` (Karpathy-split JSON), ``image_dir``, ``image_size``,
    ``tokenizer``, ``batch_size``; optional ``split`` ("test"), ``resize_size``,
    ``ks``, ``max_images`` (the first images in file order, to bound the cost).
    """

    def __init__(self, captions_file: str, image_dir: str, *, image_size: int, tokenizer,
                 batch_size: int = 64, split: str = "test", resize_size: Optional[int] = None,
                 ks: Sequence[int] = KS, max_images: Optional[int] = None):
        self.captions_file, self.image_dir, self.split = captions_file, image_dir, split
        self.image_size, self.resize_size = image_size, resize_size
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.ks, self.max_images = tuple(ks), max_images

    def run(self, encode_images: Callable, encode_texts: Callable) -> dict:
        from trainer.eval_data import CaptionedImages, karpathy_split

        data = karpathy_split(self.captions_file, self.image_dir, self.split)
        if self.max_images is not None:
            data = CaptionedImages(data.image_paths[: self.max_images], data.captions[: self.max_images])
        captions, image_of_caption = data.pairs()
        images = encode_image_files(encode_images, data.image_paths, image_size=self.image_size,
                                    resize_size=self.resize_size, batch_size=self.batch_size)
        tokens = self.tokenizer.tokenize_numpy(captions)
        texts = encode_in_batches(encode_texts, chunks(tokens, self.batch_size), self.batch_size)
        return captioned_retrieval_metrics(images, texts, image_of_caption, self.ks)
