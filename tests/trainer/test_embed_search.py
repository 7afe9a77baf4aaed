"""``trainer.embed`` (Parquet export, resumable) and ``trainer.search`` (faiss, HTML page) on a tiny run."""

import importlib.util
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from common.vectors import l2_normalize
from trainer import checkpoint, embed, search
from trainer.evaluators import encode_in_batches
from trainer.input_pipeline import make_dataset

BROWSER_TEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "pipeline", "audit", "test_report_browser.py")


@pytest.fixture(scope="module")
def encoders(tiny_trained):
    return checkpoint.Encoders(tiny_trained[0])


@pytest.fixture(scope="module")
def exported(tiny_trained, tiny_corpus, encoders, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("embeddings") / "validation")
    manifest = embed.export(tiny_trained[0], embed.ShardSource(tiny_corpus, "validation"), out,
                            part_size=5, encoders=encoders)
    return out, manifest


def test_shard_export_has_every_pair_with_its_key_and_both_embeddings(exported, tiny_corpus, encoders):
    out, manifest = exported
    assert (manifest["num_rows"], manifest["num_parts"], manifest["written"]) == (16, 4, 4)
    assert sorted(f for f in os.listdir(out) if f.endswith(".parquet")) == [
        f"part-0000{i}.parquet" for i in range(4)]
    table, read_manifest = embed.read_embeddings(out)
    assert read_manifest["step"] == encoders.step == 2 and read_manifest["embed_dim"] == 128
    # The same pairs, in file order, as the eval pipeline reads them; embeddings from the same model.
    dataset = make_dataset(tiny_corpus, "validation", global_batch_size=8, image_size=encoders.image_size,
                           resize_size=encoders.resize_size, train=False, seed=0,
                           tokenizer=encoders.tokenizer, process_index=0, process_count=1,
                           extra_features=("texts",))
    batches = list(dataset.as_numpy_iterator())
    keys = [k.decode() for b in batches for k in b["key"]]
    assert table.column("key").to_pylist() == keys
    assert table.column("caption").to_pylist() == [t.decode() for b in batches for t in b["texts"]]
    images = np.stack(table.column("image_embedding").to_pylist())
    texts = np.stack(table.column("text_embedding").to_pylist())
    want_images = encode_in_batches(encoders.encode_images, (b["image"] for b in batches), 8)
    want_texts = encode_in_batches(encoders.encode_texts, (b["text"] for b in batches), 8)
    np.testing.assert_allclose(images, want_images, atol=1e-5)
    np.testing.assert_allclose(texts, want_texts, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(images, axis=1), 1.0, rtol=1e-5)
    thumbs = table.column("thumbnail").to_pylist()
    assert all(t.startswith(b"\xff\xd8") for t in thumbs)  # JPEG thumbnails
    assert set(table.column("source").to_pylist()) == {
        os.path.join(tiny_corpus, f) for f in os.listdir(tiny_corpus) if "-validation.tfrecord-" in f}


def test_an_interrupted_export_resumes_with_only_the_missing_parts(exported, tiny_trained, tiny_corpus,
                                                                   encoders, tmp_path):
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(exported[0], out)
    before = {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in os.listdir(out) if f.endswith(".parquet")}
    os.remove(os.path.join(out, "part-00002.parquet"))       # a run killed while writing part 2
    open(os.path.join(out, "part-00002.parquet.tmp"), "w").write("half a file")
    manifest = embed.export(tiny_trained[0], embed.ShardSource(tiny_corpus, "validation"), out,
                            part_size=5, encoders=encoders)
    assert (manifest["written"], manifest["skipped"], manifest["num_rows"]) == (1, 3, 16)
    for name, mtime in before.items():
        if name != "part-00002.parquet":
            assert os.stat(os.path.join(out, name)).st_mtime_ns == mtime  # untouched
    assert pq.read_table(os.path.join(out, "part-00002.parquet")).equals(
        pq.read_table(os.path.join(exported[0], "part-00002.parquet")))
    # Another source (or part size, model, step) into the same directory is refused.
    with pytest.raises(ValueError, match="another export \\(different source, part_size\\)"):
        embed.export(tiny_trained[0], embed.ShardSource(tiny_corpus, "train"), out, part_size=7,
                     encoders=encoders)


def test_folder_and_caption_list_exports(tiny_trained, tiny_eval_folder, encoders, tmp_path):
    folder = embed.export(tiny_trained[0], embed.FolderSource(os.path.join(tiny_eval_folder, "test")),
                          str(tmp_path / "folder"), encoders=encoders)
    table, _ = embed.read_embeddings(str(tmp_path / "folder"))
    assert folder["num_rows"] == 9
    assert table.column("key").to_pylist()[:2] == ["circle/000.png", "circle/001.png"]
    assert table.column("label").to_pylist() == ["circle"] * 3 + ["square"] * 3 + ["triangle"] * 3
    assert table.column("text_embedding").null_count == 9 and table.column("image_embedding").null_count == 0

    captions = tmp_path / "captions.tsv"
    captions.write_text("c1\ta red circle\n\nc2\ta blue square\n")
    embed.export(tiny_trained[0], embed.CaptionSource(str(captions)), str(tmp_path / "captions"),
                 encoders=encoders)
    table, _ = embed.read_embeddings(str(tmp_path / "captions"))
    assert table.column("key").to_pylist() == ["c1", "c2"]
    want = encoders.encode_texts(encoders.tokenizer.tokenize_numpy(["a red circle", "a blue square"]))
    np.testing.assert_allclose(np.stack(table.column("text_embedding").to_pylist()), want, atol=1e-5)
    plain = tmp_path / "plain.txt"
    plain.write_text("first caption\nsecond caption\n")
    assert [k for k, _ in embed.CaptionSource(str(plain)).items] == ["1", "2"]


def test_embed_command_line_errors_are_one_line(tiny_trained, tmp_path, capsys):
    code = embed.main([tiny_trained[0], "--images", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])
    assert code == 1 and capsys.readouterr().err.strip() == f"error: {tmp_path / 'nowhere'}: no such image folder"
    with pytest.raises(Exception, match="not a trainer.embed output"):
        embed.read_embeddings(str(tmp_path))


def brute_force(vectors, query, k):
    scores = vectors @ query
    order = np.argsort(-scores, kind="stable")[:k]
    return order, scores[order]


def test_search_returns_the_exact_top_k_for_each_kind_of_query(exported, encoders, tiny_eval_folder):
    table, _ = embed.read_embeddings(exported[0])
    image_path = os.path.join(tiny_eval_folder, "test", "square", "000.png")
    queries = [search.Query(text="a red circle"), search.Query(image_path=image_path),
               search.Query(text="blue", image_path=image_path)]
    vectors = search.query_embeddings(queries, encoders)
    text_only = encoders.encode_texts(encoders.tokenizer.tokenize_numpy(["blue"]))[0]
    image_only = vectors[1]
    combined = (text_only + image_only) / np.linalg.norm(text_only + image_only)
    np.testing.assert_allclose(vectors[2], combined, atol=1e-6)   # the normalised sum
    results = search.search(table, queries, vectors, k=4)
    images = np.stack(table.column("image_embedding").to_pylist())
    texts = np.stack(table.column("text_embedding").to_pylist())
    captions = table.column("caption").to_pylist()
    distinct = sorted({c: i for i, c in reversed(list(enumerate(captions)))}.values())
    for result, vector in zip(results, vectors):
        if result["query"].target == "images":
            rows, scores = brute_force(images, vector, 4)
        else:
            order, scores = brute_force(texts[distinct], vector, 4)
            rows = np.asarray(distinct)[order]
        assert [h["row"] for h in result["hits"]] == rows.tolist()
        np.testing.assert_allclose([h["score"] for h in result["hits"]], scores, atol=1e-5)
        assert [h["rank"] for h in result["hits"]] == [1, 2, 3, 4]
        assert result["index"] == "exact search over 16" or result["query"].target == "texts"
    assert len({h["caption"] for h in results[1]["hits"]}) == 4  # image -> distinct texts


def test_the_inverted_file_index_is_used_above_the_threshold():
    rng = np.random.default_rng(0)
    vectors = l2_normalize(rng.normal(size=(400, 16)))
    queries = l2_normalize(rng.normal(size=(5, 16)))
    ivf = search.Index(vectors, ivf_threshold=100, nprobe=1000)   # every list probed: exact
    assert ivf.description.startswith("inverted-file search over 400 (10 lists")
    flat = search.Index(vectors, ivf_threshold=1000)
    assert flat.description == "exact search over 400"
    np.testing.assert_array_equal(ivf.search(queries, 5)[1], flat.search(queries, 5)[1])
    few = search.Index(vectors, ivf_threshold=100, nprobe=1)
    assert few.description.endswith("(10 lists, 1 probed)")


def _browser():
    spec = importlib.util.spec_from_file_location("report_browser", BROWSER_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_search_pages(exported, tiny_eval_folder, tmp_path, capsys):
    """The search command's pages for text, image and image+text queries: (text page, image+text page)."""
    page = tmp_path / "search.html"
    image_path = os.path.join(tiny_eval_folder, "test", "square", "000.png")
    code = search.main([exported[0], "--text", "a red circle", "--text", "a blue <square> & more",
                        "--image", image_path, "--text", "green", "--k", "3", "--html", str(page)])
    # 2 texts + 1 image do not pair up: the person is told so in one line.
    assert code == 1 and "give them in pairs" in capsys.readouterr().err
    assert search.main([exported[0], "--text", "a red circle", "--text", "a blue <square> & more",
                        "--k", "3", "--html", str(page)]) == 0
    assert search.main([exported[0], "--image", image_path, "--k", "3", "--html", str(tmp_path / "i.html")]) == 0
    assert search.main([exported[0], "--image", image_path, "--text", "green", "--k", "3",
                        "--html", str(tmp_path / "it.html")]) == 0
    printed = capsys.readouterr().out
    assert 'text -> images: "a red circle" (exact search over 16)' in printed
    assert "image -> texts: " in printed and "image+text -> images: " in printed
    html_text = page.read_text()
    assert "a blue &lt;square&gt; &amp; more" in html_text and "<script" not in html_text
    return page, tmp_path / "it.html"


def test_search_command_writes_its_pages(exported, tiny_eval_folder, tmp_path, capsys):
    write_search_pages(exported, tiny_eval_folder, tmp_path, capsys)


@pytest.mark.integration  # a real browser; the pages' commands and HTML are checked in the default run (above)
@pytest.mark.skipif(not os.path.exists(os.environ.get("CHROMIUM", "/usr/bin/chromium")),
                    reason="chromium absent: run scripts/install_chromium.sh")
def test_search_pages_render_in_chromium(exported, tiny_eval_folder, tmp_path, capsys):
    page, image_and_text = write_search_pages(exported, tiny_eval_folder, tmp_path, capsys)
    browser = _browser()
    profile = tmp_path / "profile"
    profile.mkdir()
    for name, images_expected in ((page, 6), (image_and_text, 4)):
        shot = tmp_path / f"{os.path.basename(str(name))}.png"
        images, events, height = browser.open_page("file://" + str(name), str(profile), top_path=str(shot))
        assert len(images) == images_expected
        assert all(i["complete"] and i["width"] > 0 for i in images), images
        assert browser._errors(events) == []
        assert [u for u in browser._requested_urls(events) if not u.startswith(("file://", "data:"))] == []
        assert browser._not_blank(str(shot)) and height > 300
