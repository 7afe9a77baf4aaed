"""Damaged shards: the trainer, trainer.vocab and the reader stop with one line naming the file, or skip and count.

Shards are damaged the ways a copy or a disk damages them: a flipped byte in a
record's payload (its checksum fails, the framing holds), a flipped byte in a
record's length (the framing is lost), a file cut short.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
import tensorflow as tf

from common import tfrecord_io as tfrecord
from trainer import input_pipeline, shard_reader, train, vocab
from trainer.configs import tiny
from trainer.shard_reader import DamagedShard, ShardReader

from tests.trainer import command_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = 10
BAD = 3  # 0-based: the fourth record


def frame_offsets(data: bytes):
    """Byte offset of every TFRecord frame."""
    offsets, at = [], 0
    while at < len(data):
        offsets.append(at)
        (length,) = struct.unpack("<Q", data[at:at + 8])
        at += 12 + length + 4
    return offsets


def damage(path, how, record=BAD):
    """Damages ``path`` in place; returns the byte offset of the damaged frame."""
    data = bytearray(open(path, "rb").read())
    at = frame_offsets(bytes(data))[record]
    if how == "payload":
        data[at + 12 + 5] ^= 0xFF
    elif how == "length":
        data[at + 2] ^= 0xFF
    elif how == "truncated":
        del data[at + 20:]
    open(path, "wb").write(bytes(data))
    return at


@pytest.fixture
def shard(tmp_path):
    path = str(tmp_path / "c-train.tfrecord-00000-of-00001")
    with open(path, "wb") as f:
        tfrecord.write_records(f, [tfrecord.encode_example({"texts": f"text {i}"}) for i in range(RECORDS)])
    return path


def texts(payloads):
    return [tfrecord.decode_example(p)["texts"][0].decode() for p in payloads]


@pytest.mark.parametrize("how, problem", [
    ("payload", "a record is corrupt (its checksum fails)"),
    ("length", "a record header is corrupt (its length fails its checksum)"),
    ("truncated", "the file ends inside a record (truncated)"),
])
def test_damage_is_one_line_naming_the_file_the_byte_and_the_record(shard, how, problem):
    at = damage(shard, how)
    reader = ShardReader(expected={shard: RECORDS}, remedy="set --config.skip_corrupt_records=true")
    with pytest.raises(DamagedShard) as error:
        list(reader.records(shard))
    message = str(error.value)
    assert "\n" not in message
    assert message == (f"{shard}: {problem} at byte {at:,} (record {BAD + 1} of {RECORDS}): the shard is damaged; "
                       "copy it again or rebuild the corpus, or set --config.skip_corrupt_records=true")


def test_skipping_drops_only_the_record_whose_checksum_fails(shard):
    damage(shard, "payload")
    reader = ShardReader(skip_corrupt=True, expected={shard: RECORDS})
    assert texts(reader.records(shard)) == [f"text {i}" for i in range(RECORDS) if i != BAD]
    assert reader.records_skipped() == 1
    assert reader.new_problems() == [reader.report()[shard]["problems"][0]] and reader.new_problems() == []
    assert reader.report()[shard]["problems"][0].endswith(": 1 record(s) skipped")


@pytest.mark.parametrize("how", ["length", "truncated"])
def test_lost_framing_skips_the_rest_of_the_shard_counted_from_its_length(shard, how):
    damage(shard, how)
    reader = ShardReader(skip_corrupt=True, expected={shard: RECORDS})
    assert texts(reader.records(shard)) == [f"text {i}" for i in range(BAD)]
    assert reader.records_skipped() == RECORDS - BAD
    # Without dataset_info.json the size of the lost tail is unknown, and said so.
    unknown = ShardReader(skip_corrupt=True)
    assert len(list(unknown.records(shard))) == BAD and unknown.records_skipped() == 0
    assert unknown.report()[shard]["unknown_tail"] and "unknown" in unknown.report()[shard]["problems"][0]


def test_a_length_beyond_any_record_is_damage_not_an_allocation(shard):
    data = bytearray(open(shard, "rb").read())
    at = frame_offsets(bytes(data))[BAD]
    length = (1 << 40).to_bytes(8, "little")
    data[at:at + 12] = length + tfrecord._masked_crc(length)  # a valid checksum of a huge length
    open(shard, "wb").write(bytes(data))
    with pytest.raises(DamagedShard, match="claims 1,099,511,627,776 bytes"):
        list(ShardReader().records(shard))


def test_through_tf_data_the_error_comes_back_out_and_skipping_keeps_order(shard):
    damage(shard, "payload")
    with pytest.raises(tf.errors.OpError) as error:
        list(ShardReader(expected={shard: RECORDS}).dataset(tf.constant(shard)).as_numpy_iterator())
    found = shard_reader.damage_in(error.value)
    assert isinstance(found, DamagedShard) and str(found).startswith(f"{shard}: a record is corrupt")
    assert shard_reader.damage_in(ValueError("unrelated")) is None
    kept = ShardReader(skip_corrupt=True).dataset(tf.constant(shard))
    assert texts(kept.as_numpy_iterator()) == [f"text {i}" for i in range(RECORDS) if i != BAD]


@pytest.fixture
def damaged_corpus(tiny_corpus, tmp_path):
    """A copy of the tiny corpus whose every train shard has one record with a failing checksum."""
    corpus = tmp_path / "damaged"
    shutil.copytree(tiny_corpus, corpus)
    shards = input_pipeline.list_shards(str(corpus), "train")
    for path in shards:
        damage(path, "payload")
    return str(corpus), shards


# The command line in this process in the default run; in a process of its own (TensorFlow and JAX started
# again, a dozen CPU-seconds) in CI's integration run.
@pytest.mark.parametrize("process", ["this", pytest.param("own", marks=pytest.mark.integration)])
def test_trainer_command_line_names_the_damaged_shard_in_one_line(process, damaged_corpus, tmp_path, capfd):
    corpus, shards = damaged_corpus
    argv = ["--config", command_line.TINY, "--workdir", str(tmp_path / "run"), f"--config.data_dir={corpus}",
            "--config.batch_size=8", "--config.image_size=32", "--config.max_text_len=16", "--config.total_steps=2",
            "--config.xla_cpu_fast_compile=true",
            f"--config.compilation_cache_dir={os.environ['JAX_COMPILATION_CACHE_DIR']}"]
    if process == "this":
        status, _, stderr = command_line.run(argv, capfd)
    else:
        done = subprocess.run([sys.executable, "-m", "trainer.train", *argv], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})
        status, stderr = done.returncode, done.stderr
    assert status == 1
    assert stderr.count("\n") == 1, stderr
    named = stderr.split(": ")[1]
    assert named in shards and stderr.startswith(f"error: {named}: a record is corrupt (its checksum fails) at byte ")
    assert "--config.skip_corrupt_records=true" in stderr and "IteratorGetNext" not in stderr


def test_trainer_skips_a_damaged_record_when_told_counts_and_reports_it(damaged_corpus, tmp_path):
    corpus, shards = damaged_corpus
    workdir = str(tmp_path / "run")
    config = tiny.get_config()
    config.evals = {}
    config.update(data_dir=corpus, skip_corrupt_records=True, total_steps=2, log_every=1,
                  batch_size=32,  # two steps read every shard (64 records, three lost)
                  image_size=32, resize_size=36, max_text_len=16, xla_cpu_fast_compile=True,
                  compilation_cache_dir=os.environ["JAX_COMPILATION_CACHE_DIR"])
    final = train.train_and_evaluate(config, workdir)
    assert final["step"] == 2 and final["data/records_skipped"] == 3  # each once, though read in two epochs
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        logged = [m["data/records_skipped"] for m in map(json.loads, f) if "train/loss" in m]
    assert len(logged) == 2 and logged[-1] == 3


def test_vocab_command_line_names_the_damaged_shard_in_one_line(damaged_corpus, tmp_path, capsys):
    corpus, shards = damaged_corpus
    assert vocab.main(["--data_dir", corpus, "--vocab_size", "40", "--output", str(tmp_path / "v.txt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.split(": ")[1] in shards and "a record is corrupt" in err and "rebuild" in err
    assert not (tmp_path / "v.txt").exists()


def test_a_truncated_dataset_info_is_named_not_a_json_traceback(tiny_corpus, tmp_path):
    from common.corpus_dir import DamagedFile

    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    info = corpus / "dataset_info.json"
    info.write_bytes(info.read_bytes()[:40])
    with pytest.raises(DamagedFile) as error:
        input_pipeline.shard_reader(str(corpus), "train")
    assert str(error.value).startswith(f"{info}: not valid JSON (") and "\n" not in str(error.value)
