"""The embedded sample corpus: realistic raw candidates with planted faults, and their expected fates.

    python -m samplegen --out data/sample [--num_candidates 3000] [--seed 0] [--processes N]

Writes, under ``--out``::

    candidates/part-00000-of-0000K.parquet ...   img2dataset-style rows (samplegen.writer.CANDIDATE_SCHEMA)
    candidates/part-<K-1>-of-0000K.parquet       the last part has no ``caption`` column at all
    manifest.jsonl                               one line per candidate row, in file order
    eval/{train,test}/<class>/<class>_NNN.png    a labelled evaluation set of drawn shapes
    sample_info.json                             sizes, seed, eval set, --set overrides for the build

Content. ``--num_candidates`` ordinary candidates (drawn shape scenes, most of
them, and crops of the photographs shipped in scikit-image / scikit-learn,
each with an alt-text describing it, see ``samplegen.content``) plus
about 1,250 planted rows, one group per *case*, each with the fate a correct
ALIGN build must give it: at and around every image threshold, every image
format, EXIF orientation, corrupt / truncated / non-image bytes, a
decompression bomb, caption faults, boilerplate alt-texts shared by many
images, one image with more than 1000 alt-texts, rare-token junk captions,
near-duplicates of evaluation images, repeated (url, caption) pairs and a
part file without a caption column. Rows are shuffled across the parts.
On top, ``mismatched_pair`` rows (``plan.MISMATCHED_SHARE`` of
``--num_candidates``): an ordinary-looking picture whose alt-text was worded
for another drawn scene, one that shows none of the picture's shapes. ALIGN's
rules keep them (expected ``"written"``); a model-score stage should not.

Manifest lines: ``{"pipeline_key": make_key(url, caption or ""), "url",
"case", "expected", "note", "key" (the row's img2dataset key, unique),
"file" (part file name), "size" ([w, h] after EXIF orientation, or null),
"pairing", "expected_with_model_score"}``. ``pairing`` says what the
alt-text is of the row's own picture: ``"clean"`` (it describes it),
``"mismatched"`` (it describes another picture: the ``mismatched_pair``
rows, and most alt-texts of the one image with over 1000 of them), or null
(no picture of its own, or an alt-text that describes nothing:
boilerplate, junk, keyword lists, fixed words). Every row expected to be written is clean or mismatched.
``expected`` is ``"written"``, the first rejection reason in
``filters.stages`` order, or ``"written_once"``: a group of rows with the
*same* (url, caption), hence the same pipeline key, of which exactly one is
written and every other one is rejected as ``duplicate_pair/repeat``; which
one is kept is the pipeline's own deterministic choice, so the manifest does
not name it.
``expected_with_model_score`` is the fate under a build that also runs the
model-score stage (``--model_score``) with a model that tells a mismatched
pair from a clean one: ``"model_score"`` (rejected by that stage, under
whichever of its cuts the build sets) for every mismatched pair that
reaches it: the ``mismatched_pair`` rows and the mismatched alt-texts of the
image with over 1000 of them, whose first reason it becomes, since the stage
runs before the corpus stages; ``expected`` for every other row. A real
model is judged against it by shares: clean pairs it cuts, mismatched
pairs it keeps. ``sample_info.json``'s ``expected_with_model_score``
counts the rows whose fate it changes.

Expected fates of the whole-corpus stages (texts per image, images per text,
rare n-grams) assume the build runs with ``sample_info.json``'s
``build_overrides``: the corpus is tiny, so the ALIGN vocabulary of 100M
n-grams would keep every n-gram; a minimum n-gram count is used instead, and
k-means gets fewer clusters than the sample has images. No picture is
pornographic (the NSFW stage, if it runs, should reject nothing).
The generator checks its own expectations before writing (``verify_plan``)
and fails loudly if one does not hold: ordinary alt-texts are re-worded or
re-drawn (deterministically) until every n-gram of every alt-text that should
be written is frequent, no ordinary alt-text is used by more than 3 images,
and no ordinary image is close to an evaluation image under the
near-duplicate embedder (``dedup.embedders``); each planted near-duplicate
is checked to be detected by it.

Not planted: ``read/caption_not_utf8`` (pyarrow refuses to write invalid
UTF-8 into a string column, other writers do not; ``tests/pipeline/readers/test_file_records.py``
writes such a file). EXIF orientation cannot change an ALIGN verdict (shorter
side and longer/shorter ratio do not change when width and height swap);
the EXIF rows check that the upright picture is the one kept and described.

Modules: ``plan`` (rows, units, recipes, thresholds), ``drawers`` and
``cases`` (the planted cases), ``faults`` (non-picture bytes), ``render``
(encodings, worker pool), ``scenes`` / ``photos`` / ``content`` (what the
pictures show and say), ``evalset``, ``checks`` (settle, verify), ``writer``,
``generate`` (plan and write), ``__main__`` (the CLI). A test-data tool:
``setup.py`` does not install it.

Deterministic: every row draws from ``numpy.random.default_rng([seed,
stream, slot, attempt])``; the same seed gives byte-identical files whatever
``--processes`` is.
"""
