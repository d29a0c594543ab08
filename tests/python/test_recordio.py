"""mx.recordio against the .rec/.idx byte layout of dmlc-core, which MXNet 1.9.1 reads and writes.

The expected bytes are spelled out by hand from the format: each part is the magic 0xced7230a,
then a word (cflag << 29 | length), then the bytes, zero-padded to a multiple of 4; a payload
holding the magic at a 4-byte-aligned offset is split there (cflag 1 first, 2 middle, 3 last)."""

import pickle

import numpy as np
import pytest

import oxnet as mx

MAGIC = b"\x0a\x23\xd7\xce"  # 0xced7230a, little-endian

# (payload, its bytes in the file)
RECORDS = [
    (b"abc", MAGIC + b"\x03\x00\x00\x00" + b"abc\x00"),
    (b"", MAGIC + b"\x00\x00\x00\x00"),
    (b"abcd", MAGIC + b"\x04\x00\x00\x00" + b"abcd"),
    # The magic at offset 4: first part "wxyz" (cflag 1), last part "12" (cflag 3, 2 bytes of padding).
    (b"wxyz" + MAGIC + b"12",
     MAGIC + b"\x04\x00\x00\x20" + b"wxyz" + MAGIC + b"\x02\x00\x00\x60" + b"12\x00\x00"),
    # The magic at an unaligned offset is not a part boundary.
    (b"x" + MAGIC + b"yyy", MAGIC + b"\x08\x00\x00\x00" + b"x" + MAGIC + b"yyy"),
    # Two magics in a row, first at offset 0: empty first (1), empty middle (2), last "tail" (3).
    (MAGIC + MAGIC + b"tail",
     MAGIC + b"\x00\x00\x00\x20" + MAGIC + b"\x00\x00\x00\x40" + MAGIC + b"\x04\x00\x00\x60" + b"tail"),
]


def test_writer_produces_the_dmlc_byte_layout(tmp_path):
    path = tmp_path / "hand.rec"
    writer = mx.recordio.MXRecordIO(str(path), "w")
    for payload, _ in RECORDS:
        writer.write(payload)
    writer.close()
    assert path.read_bytes() == b"".join(encoded for _, encoded in RECORDS)


def test_reader_reads_hand_made_file(tmp_path):
    path = tmp_path / "hand.rec"
    path.write_bytes(b"".join(encoded for _, encoded in RECORDS))
    reader = mx.recordio.MXRecordIO(str(path), "r")
    for payload, _ in RECORDS:
        assert reader.read() == payload
    assert reader.read() is None
    reader.reset()
    assert reader.read() == RECORDS[0][0]


def test_indexed_file_offsets_and_random_access(tmp_path):
    rec, idx = tmp_path / "hand.rec", tmp_path / "hand.idx"
    writer = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "w")
    for key, (payload, _) in enumerate(RECORDS):
        writer.write_idx(key * 10, payload)
    writer.close()
    offsets = np.cumsum([0] + [len(encoded) for _, encoded in RECORDS])[:-1]
    assert list(offsets) == [0, 12, 20, 32, 56, 72]
    assert idx.read_text() == "".join("%d\t%d\n" % (key * 10, offset) for key, offset in enumerate(offsets))

    reader = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "r")
    assert reader.keys == [0, 10, 20, 30, 40, 50]
    for key in [50, 30, 0, 40, 10, 20, 30]:
        assert reader.read_idx(key) == RECORDS[key // 10][0]


def test_image_record_header_layout():
    # struct 'IfQQ': flag, float label, id, id2 (24 bytes).
    packed = mx.recordio.pack(mx.recordio.IRHeader(5, 3.0, 7, 1), b"img")
    assert packed == (b"\x00\x00\x00\x00" + b"\x00\x00\x40\x40" + b"\x07" + b"\x00" * 7 + b"\x01" + b"\x00" * 7
                      + b"img")
    header, payload = mx.recordio.unpack(packed)
    assert header == mx.recordio.IRHeader(0, 3.0, 7, 1) and payload == b"img"

    # A label array: flag = its size, the header's label 0, the float32 labels before the payload.
    packed = mx.recordio.pack((0, [1.0, -2.0], 9, 0), b"x")
    assert packed == (b"\x02\x00\x00\x00" + b"\x00" * 4 + b"\x09" + b"\x00" * 15
                      + b"\x00\x00\x80\x3f" + b"\x00\x00\x00\xc0" + b"x")
    header, payload = mx.recordio.unpack(packed)
    assert header.flag == 2 and header.id == 9 and payload == b"x"
    np.testing.assert_array_equal(header.label, np.array([1.0, -2.0], dtype=np.float32))


def test_pickled_reader_reopens_its_file(tmp_path):
    path = tmp_path / "p.rec"
    writer = mx.recordio.MXRecordIO(str(path), "w")
    for i in range(3):
        writer.write(b"record %d" % i)
    writer.close()
    reader = mx.recordio.MXRecordIO(str(path), "r")
    assert reader.read() == b"record 0"
    copy = pickle.loads(pickle.dumps(reader))
    assert [copy.read() for _ in range(4)] == [b"record 0", b"record 1", b"record 2", None]

    indexed_writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "p.idx"), str(tmp_path / "q.rec"), "w")
    indexed_writer.write_idx(4, b"four")
    indexed_writer.close()
    indexed = pickle.loads(pickle.dumps(mx.recordio.MXIndexedRecordIO(str(tmp_path / "p.idx"),
                                                                      str(tmp_path / "q.rec"), "r")))
    assert indexed.read_idx(4) == b"four"


def test_large_record_with_many_magics_round_trips(tmp_path):
    rng = np.random.RandomState(0)
    words = rng.randint(0, 2**32, size=50000, dtype=np.uint64).astype(np.uint32)
    words[rng.rand(words.size) < 0.01] = 0xced7230a
    payload = words.tobytes() + b"end"
    path = tmp_path / "big.rec"
    writer = mx.recordio.MXRecordIO(str(path), "w")
    writer.write(payload)
    writer.write(b"next")
    writer.close()
    assert path.stat().st_size % 4 == 0
    reader = mx.recordio.MXRecordIO(str(path), "r")
    assert reader.read() == payload
    assert reader.read() == b"next"


def test_bad_files_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="Invalid flag"):
        mx.recordio.MXRecordIO(str(tmp_path / "x.rec"), "a")
    with pytest.raises(mx.MXNetError, match="cannot open"):
        mx.recordio.MXRecordIO(str(tmp_path / "missing.rec"), "r")

    bad = tmp_path / "bad.rec"
    bad.write_bytes(b"\x00\x01\x02\x03\x04\x00\x00\x00abcd")
    with pytest.raises(mx.MXNetError, match="magic number"):
        mx.recordio.MXRecordIO(str(bad), "r").read()

    cut = tmp_path / "cut.rec"
    cut.write_bytes(MAGIC + b"\x08\x00\x00\x00" + b"abc")
    with pytest.raises(mx.MXNetError, match="cut off"):
        mx.recordio.MXRecordIO(str(cut), "r").read()

    orphan = tmp_path / "orphan.rec"
    orphan.write_bytes(MAGIC + b"\x00\x00\x00\x60")
    with pytest.raises(mx.MXNetError, match="part flag 3"):
        mx.recordio.MXRecordIO(str(orphan), "r").read()

    writer = mx.recordio.MXRecordIO(str(tmp_path / "w.rec"), "w")
    with pytest.raises(TypeError, match="bytes"):
        writer.write("text")
    with pytest.raises(mx.MXNetError, match="header"):
        mx.recordio.unpack(b"short")


def test_pack_img_round_trip_in_opencv_channel_order():
    pytest.importorskip("PIL")
    rng = np.random.RandomState(1)
    bgr = rng.randint(0, 256, size=(12, 9, 3)).astype(np.uint8)
    header, decoded = mx.recordio.unpack_img(mx.recordio.pack_img((0, 2.0, 3, 0), bgr, quality=3, img_fmt=".png"))
    assert header.label == 2.0 and header.id == 3
    np.testing.assert_array_equal(decoded, bgr)
    _, gray = mx.recordio.unpack_img(mx.recordio.pack_img((0, 0.0, 0, 0), bgr, img_fmt=".png"), iscolor=0)
    assert gray.shape == (12, 9)

    smooth = np.zeros((32, 32, 3), dtype=np.uint8)
    smooth[:, :, 0] = 200  # blue in BGR
    smooth[:, :, 2] = 20
    _, decoded = mx.recordio.unpack_img(mx.recordio.pack_img((0, 1.0, 0, 0), smooth, quality=95), iscolor=1)
    assert decoded.shape == (32, 32, 3)
    assert np.abs(decoded.astype(int) - smooth).max() <= 3
    with pytest.raises(ValueError, match="unsupported image format"):
        mx.recordio.pack_img((0, 1.0, 0, 0), smooth, img_fmt=".gif")
