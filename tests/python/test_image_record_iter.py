"""mx.io.ImageRecordIter, mx.image.ImageIter and gluon's ImageRecordDataset over .rec files made
with mx.recordio.pack_img. PNG keeps pixels exact, so outputs are checked against NumPy."""

import numpy as np
import pytest

import oxnet as mx

pytest.importorskip("PIL")

N_IMAGES = 10


def _write_rec(tmp_path, n=N_IMAGES, shape=(20, 24, 3), labels=None, fmt=".png", name="images", with_idx=True):
    """Random BGR images (as OpenCV and pack_img hold them) with label i (or labels[i]) and id i."""
    rng = np.random.RandomState(0)
    rec, idx = str(tmp_path / (name + ".rec")), str(tmp_path / (name + ".idx"))
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    images = []
    for i in range(n):
        img = rng.randint(0, 256, size=shape).astype(np.uint8)
        images.append(img)
        label = float(i) if labels is None else labels[i]
        writer.write_idx(i, mx.recordio.pack_img((0, label, i, 0), img, img_fmt=fmt))
    writer.close()
    return rec, (idx if with_idx else ""), images


def _rgb_chw(bgr):
    return bgr[:, :, ::-1].transpose(2, 0, 1).astype(np.float32)


def _epoch(it):
    return [(b.data[0].asnumpy(), b.label[0].asnumpy(), b.pad, b.index) for b in it]


def test_batches_labels_and_normalization_match_numpy(tmp_path):
    rec, _, images = _write_rec(tmp_path)
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 24), batch_size=4, mean_r=10.0, mean_g=20.0,
                               mean_b=30.0, std_r=2.0, std_g=4.0, std_b=8.0, scale=0.5, preprocess_threads=2)
    assert it.provide_data[0].name == "data" and it.provide_data[0].shape == (4, 3, 20, 24)
    assert it.provide_label[0].name == "softmax_label" and it.provide_label[0].shape == (4,)
    mean = np.array([10.0, 20.0, 30.0], dtype=np.float32)[:, None, None]
    mult = np.array([0.5 / 2, 0.5 / 4, 0.5 / 8], dtype=np.float32)[:, None, None]
    batches = _epoch(it)
    assert [b[2] for b in batches] == [0, 0, 2]
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]  # the last batch is filled round robin
    data = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(labels, np.array(order, dtype=np.float32))
    np.testing.assert_array_equal(np.concatenate([b[3] for b in batches]), order)
    for got, i in zip(data, order):
        np.testing.assert_allclose(got, (_rgb_chw(images[i]) - mean) * mult, rtol=1e-6, atol=1e-5)


def test_round_batch_continues_next_epoch_after_the_borrowed_images(tmp_path):
    rec, _, _ = _write_rec(tmp_path)
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 24), batch_size=4)
    first = np.concatenate([b[1] for b in _epoch(it)])
    it.reset()
    second = _epoch(it)
    np.testing.assert_array_equal(first, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1])
    # Images 0 and 1 padded the last batch, so this epoch starts at 2 and ends exactly.
    np.testing.assert_array_equal(np.concatenate([b[1] for b in second]), [2, 3, 4, 5, 6, 7, 8, 9])
    assert [b[2] for b in second] == [0, 0]

    # A reset in the middle of an epoch starts again from the beginning.
    it.reset()
    it.next()
    it.reset()
    np.testing.assert_array_equal(it.next().label[0].asnumpy(), [0, 1, 2, 3])


def test_without_round_batch_the_last_batch_is_zero_padded(tmp_path):
    rec, _, _ = _write_rec(tmp_path)
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 24), batch_size=4, round_batch=False)
    for _ in range(2):
        batches = _epoch(it)
        assert [b[2] for b in batches] == [0, 0, 2]
        np.testing.assert_array_equal(batches[2][1][:2], [8, 9])
        assert not batches[2][0][2:].any()
        it.reset()


@pytest.mark.parametrize("with_idx", [True, False])
def test_parts_split_the_file_without_overlap(tmp_path, with_idx):
    rec, idx, _ = _write_rec(tmp_path, n=11, with_idx=with_idx)
    seen = []
    for part in range(3):
        it = mx.io.ImageRecordIter(path_imgrec=rec, path_imgidx=idx, data_shape=(3, 20, 24), batch_size=1,
                                   part_index=part, num_parts=3)
        labels = [int(b[1][0]) for b in _epoch(it)]
        assert labels == sorted(labels) and labels
        seen.append(labels)
    assert sorted(sum(seen, [])) == list(range(11))
    if with_idx:
        # With an index, parts are runs of ceil(11 / 3) = 4 records.
        assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]


def test_shuffle_is_a_seeded_permutation_per_epoch(tmp_path):
    rec, idx, _ = _write_rec(tmp_path, n=12)

    def epochs(seed):
        it = mx.io.ImageRecordIter(path_imgrec=rec, path_imgidx=idx, data_shape=(3, 20, 24), batch_size=4,
                                   shuffle=True, seed=seed)
        out = []
        for _ in range(2):
            out.append(np.concatenate([b[1] for b in _epoch(it)]).astype(int).tolist())
            it.reset()
        return out

    first, second = epochs(3)
    assert sorted(first) == sorted(second) == list(range(12))
    assert first != second and first != list(range(12))
    assert epochs(3) == [first, second]


def test_resize_center_crop_and_mirror(tmp_path):
    # 40 x 60 (H x W), left half dark, right half bright, one bright column marker at x = 24..25.
    img = np.zeros((40, 60, 3), dtype=np.uint8)
    img[:, 30:] = 200
    img[:, 24:26] = 255
    rec, idx = str(tmp_path / "g.rec"), str(tmp_path / "g.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    writer.write_idx(0, mx.recordio.pack_img((0, 1.0, 0, 0), img, img_fmt=".png"))
    writer.close()
    # Shorter edge 40 -> 20 (nearest): 20 x 30; the center 20 x 20 crop is columns 5..24.
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 20), batch_size=1, resize=20, inter_method=0)
    out = it.next().data[0].asnumpy()[0, 0]
    expected = np.zeros(30, dtype=np.float32)
    expected[15:] = 200
    expected[12] = 255
    np.testing.assert_array_equal(out, np.tile(expected[5:25], (20, 1)))
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 20), batch_size=1, resize=20, inter_method=0,
                               mirror=True, dtype="uint8")
    mirrored = it.next().data[0]
    assert mirrored.dtype == np.uint8
    np.testing.assert_array_equal(mirrored.asnumpy()[0, 0], np.tile(expected[5:25][::-1], (20, 1)))

    # A random crop is a window of the resized image.
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 20), batch_size=1, resize=20, inter_method=0,
                               rand_crop=True, rand_mirror=True, seed=5)
    windows = [np.tile(expected[x:x + 20], (20, 1)) for x in range(11)]
    for _ in range(8):
        got = it.next().data[0].asnumpy()[0, 0]
        assert any((got == w).all() or (got == w[:, ::-1]).all() for w in windows)
        it.reset()


def test_multi_labels_gray_and_jpeg(tmp_path):
    labels = [[i, 2.0 * i, -i] for i in range(6)]
    rec, _, images = _write_rec(tmp_path, n=6, labels=labels, shape=(16, 16, 3), fmt=".jpg")
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 16, 16), batch_size=3, label_width=3)
    assert it.provide_label[0].shape == (3, 3)
    batch = it.next()
    np.testing.assert_array_equal(batch.label[0].asnumpy(), np.array(labels[:3], dtype=np.float32))
    assert batch.data[0].shape == (3, 3, 16, 16)
    with pytest.raises(mx.MXNetError, match="label_width"):
        mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 16, 16), batch_size=3).next()

    rec, _, images = _write_rec(tmp_path, n=2, shape=(8, 8, 3), name="gray")
    gray = mx.io.ImageRecordUInt8Iter(path_imgrec=rec, data_shape=(1, 8, 8), batch_size=2).next().data[0]
    assert gray.shape == (2, 1, 8, 8) and gray.dtype == np.uint8
    # ITU-R 601 luma, as both OpenCV and Pillow compute it.
    luma = images[0][:, :, 2] * 0.299 + images[0][:, :, 1] * 0.587 + images[0][:, :, 0] * 0.114
    assert np.abs(gray.asnumpy()[0, 0] - luma).max() <= 1.0


def test_image_list_labels_override_the_records(tmp_path):
    rec, _, _ = _write_rec(tmp_path, n=4)
    lst = tmp_path / "images.lst"
    lst.write_text("".join("%d\t%f\t%f\timg%d.jpg\n" % (i, 10 + i, 20 + i, i) for i in range(4)))
    it = mx.io.ImageRecordIter(path_imgrec=rec, path_imglist=str(lst), data_shape=(3, 20, 24), batch_size=4,
                               label_width=2)
    np.testing.assert_array_equal(it.next().label[0].asnumpy(), [[10 + i, 20 + i] for i in range(4)])


def test_bad_arguments_raise(tmp_path):
    rec, _, _ = _write_rec(tmp_path, n=3)
    with pytest.raises(mx.MXNetError, match="path_imgrec"):
        mx.io.ImageRecordIter(path_imgrec=str(tmp_path / "none.rec"), data_shape=(3, 8, 8), batch_size=2)
    with pytest.raises(mx.MXNetError, match="data_shape"):
        mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(2, 8, 8), batch_size=2)
    with pytest.raises(mx.MXNetError, match="max_rotate_angle"):
        mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 8, 8), batch_size=2, max_rotate_angle=10)
    with pytest.raises(mx.MXNetError, match="too few"):
        mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 24), batch_size=8)
    with pytest.raises(mx.MXNetError, match="inter_method"):
        mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 20, 24), batch_size=1, inter_method=7)
    broken = str(tmp_path / "broken.rec")
    writer = mx.recordio.MXRecordIO(broken, "w")
    writer.write(mx.recordio.pack((0, 1.0, 7, 0), b"not an image"))
    writer.close()
    with pytest.raises(mx.MXNetError, match="cannot decode image 7"):
        mx.io.ImageRecordIter(path_imgrec=broken, data_shape=(3, 8, 8), batch_size=1).next()
    # An image smaller than data_shape is enlarged first, as MXNet does.
    assert mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 30, 30), batch_size=1).next().data[0].shape == \
        (1, 3, 30, 30)


def test_module_trains_from_the_iterator(tmp_path):
    rec, _, _ = _write_rec(tmp_path, n=8, shape=(8, 8, 3))
    it = mx.io.ImageRecordIter(path_imgrec=rec, data_shape=(3, 8, 8), batch_size=4, scale=1 / 255.0)
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.flatten(mx.sym.Variable("data")), num_hidden=10),
                               name="softmax")
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.fit(it, num_epoch=2, optimizer_params={"learning_rate": 0.1})
    assert mod.score(it, "acc")[0][0] == "accuracy"


def test_image_iter_and_image_record_dataset(tmp_path):
    rec, idx, images = _write_rec(tmp_path, n=5)
    it = mx.image.ImageIter(batch_size=2, data_shape=(3, 20, 24), path_imgrec=rec)
    batches = list(it)
    assert [b.pad for b in batches] == [0, 0, 1]
    np.testing.assert_array_equal(batches[0].label[0].asnumpy(), [0, 1])
    np.testing.assert_array_equal(batches[0].data[0].asnumpy()[1], _rgb_chw(images[1]))

    it = mx.image.ImageIter(batch_size=2, data_shape=(3, 20, 24), path_imgrec=rec, path_imgidx=idx,
                            num_parts=2, part_index=1, last_batch_handle="discard")
    np.testing.assert_array_equal(np.concatenate([b.label[0].asnumpy() for b in it]), [2, 3])

    dataset = mx.gluon.data.vision.ImageRecordDataset(rec)
    assert len(dataset) == 5
    img, label = dataset[3]
    assert label == 3.0 and img.shape == (20, 24, 3)
    np.testing.assert_array_equal(img.asnumpy(), images[3][:, :, ::-1])
