"""An optional extra stage: keep alt-texts in the wanted languages (CC12M's "language" step).

Language identification by ``langid`` (Lui & Baldwin 2012; ``pip install
'.[language]'``, BSD-3-Clause). Its model ships inside the package, so
nothing is downloaded at run time; it is loaded once per worker process, on
first use.

The rule, per alt-text: langid's most probable language and its probability
(``langid``'s normalised ranker). The record is kept if that language is one
of ``languages`` and the probability is at least ``min_probability``.
Otherwise it is rejected with a reason per language: ``language/<code>``
(ISO 639-1, e.g. ``language/de``) when another language wins with at least
``min_probability``, ``language/uncertain`` when no language reaches it.
Short alt-texts are where language identification is weakest: the threshold
is the user's trade-off between losing short captions and letting other
languages in.

Use: ``--stage filters.language:ENGLISH`` (English, probability >= 0.5), or
a stage of your own from ``language_stage(...)`` in your module.
"""

from __future__ import annotations

from typing import Iterable, Optional

from filters.extra_stages import RecordStage, RecordView

#: langid's 97 languages (its ``langid.langid.model`` labels), so that every
#: reason the stage can give is declared up front.
LANGID_LANGUAGES = (
    "af am an ar as az be bg bn br bs ca cs cy da de dz el en eo es et eu fa fi fo fr ga gl gu he hi hr ht hu "
    "hy id is it ja jv ka kk km kn ko ku ky la lb lo lt lv mg mk ml mn mr ms mt nb ne nl nn no oc or pa pl ps "
    "pt qu ro ru rw se si sk sl sq sr sv sw ta te th tl tr ug uk ur vi vo wa xh zh zu"
).split()
UNCERTAIN = "uncertain"


class LanguageCheck:
    """Picklable check: the langid identifier loads lazily in each process."""

    def __init__(self, languages: Iterable[str], min_probability: float):
        self.languages = tuple(languages)
        self.min_probability = float(min_probability)
        self._identifier = None

    def __getstate__(self):
        return {"languages": self.languages, "min_probability": self.min_probability, "_identifier": None}

    def identify(self, text: str):
        if self._identifier is None:
            try:
                from langid.langid import LanguageIdentifier, model
            except ImportError:
                raise RuntimeError("the language stage needs langid: pip install '.[language]'") from None
            self._identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
        return self._identifier.classify(text)

    def __call__(self, record: RecordView) -> Optional[str]:
        language, probability = self.identify(record.text)
        if probability < self.min_probability:
            return UNCERTAIN
        return None if language in self.languages else language


def language_stage(languages=("en",), min_probability: float = 0.5, name: str = "language",
                   after: str = "text_repetition") -> RecordStage:
    """An extra stage keeping alt-texts identified as one of ``languages`` with ``min_probability``."""
    unknown = sorted(set(languages) - set(LANGID_LANGUAGES))
    if unknown:
        raise ValueError(f"languages langid does not know: {', '.join(unknown)}")
    if not 0.0 <= min_probability <= 1.0:
        raise ValueError(f"min_probability must be in [0, 1], got {min_probability}")
    return RecordStage(
        name=name, after=after, check=LanguageCheck(languages, min_probability),
        reasons=tuple(LANGID_LANGUAGES) + (UNCERTAIN,),
        description=f"alt-text identified as {'/'.join(languages)} with probability >= {min_probability} (langid)",
    )


ENGLISH = language_stage(("en",), 0.5)
