import pytest

from filters import text
from filters.presets import get_preset

ALIGN = get_preset("align")
CC12M = get_preset("cc12m")


def test_normalisation_nfc_whitespace_and_invisibles():
    nfd = "cafe\u0301  au\tlait\u200b\n"
    assert text.normalize_text(nfd) == "caf\u00e9 au lait"
    assert text.normalize_text("\u200b\u200d \x00 \ufeff") == ""


def test_tokenisation_words_and_bigrams():
    assert text.words("Don't PANIC: 25&id image_tid!") == ["don't", "panic", "25", "id", "image_tid"]
    assert text.ngrams("a b c") == ["a", "b", "c", "a b", "b c"]
    assert text.ngrams("a b c", max_order=1) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "caption, reason",
    [
        ("", "text/empty"),
        ("   \u200b ", "text/empty"),
        ("bad \ufffd bytes here", "text/invalid_encoding"),
        ("word " * 300, "text/too_long_chars"),
        ("two words", "text_length/too_few_words"),
        ("one two three", None),
        (" ".join(["w%d" % i for i in range(20)]), None),
        (" ".join(["w%d" % i for i in range(21)]), "text_length/too_many_words"),
        ("dog dog dog dog cat", None),  # align does not limit repetition
    ],
)
def test_align_text_rules(caption, reason):
    assert text.check_text(caption, ALIGN)[1] == reason


@pytest.mark.parametrize(
    "caption, repetition, reason",
    [
        ("red sports car", 0.0, None),  # 3 words: CC12M's minimum is reachable
        ("a cat on a mat", 0.2, None),  # 1 repeat in 5 words: at the limit, kept
        ("the cat and the dog", 0.2, None),
        ("the dog and the dog", 0.4, "text_repetition/repetitive"),
        ("a a b b c c d e f g", 0.3, "text_repetition/repetitive"),
        ("dog dog dog dog cat", 0.6, "text_repetition/repetitive"),
        ("two words", 0.0, "text_length/too_few_words"),
    ],
)
def test_cc12m_word_repetition_is_repeated_words_over_words(caption, repetition, reason):
    assert text.repetition(text.words(caption)) == pytest.approx(repetition)
    assert text.check_text(caption, CC12M)[1] == reason


def test_cc12m_repetition_and_length():
    assert text.check_text("dog dog dog dog cat", CC12M)[1] == "text_repetition/repetitive"
    long_caption = " ".join(f"w{i}" for i in range(100))
    assert text.check_text(long_caption, CC12M)[1] is None


def test_caption_decoding():
    assert text.decode_caption(b"caf\xc3\xa9") == ("caf\u00e9", None)
    assert text.decode_caption(b"\xff\xfe bad")[1] == "read/caption_not_utf8"
    assert text.decode_caption(None)[1] == "read/missing_caption"
