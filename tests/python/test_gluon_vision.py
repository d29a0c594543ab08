"""mx.image, the _image_* operators, gluon.data.vision (transforms and datasets) and Block.save/load,
checked against NumPy (and Pillow for decoding) references."""

import io
import os

import numpy as np
import pytest

import oxnet as mx
from oxnet import autograd, gluon, nd
from oxnet.gluon.data.vision import transforms


def _random_image(shape, dtype="uint8", seed=0):
    return np.random.RandomState(seed).uniform(0, 255, shape).astype(dtype)


# --- resizing: NumPy references of OpenCV's conventions ---------------------------------------

def _bilinear_reference(image, out_h, out_w):
    """OpenCV's bilinear resize: pixel centres at (i + 0.5) * scale - 0.5, borders replicated."""
    def axis(src, dst):
        f = (np.arange(dst) + 0.5) * src / dst - 0.5
        lo = np.floor(f)
        t = f - lo
        lo = lo.astype(int)
        return np.clip(lo, 0, src - 1), np.clip(lo + 1, 0, src - 1), t

    h, w = image.shape[:2]
    y0, y1, ty = axis(h, out_h)
    x0, x1, tx = axis(w, out_w)
    img = image.astype(np.float64)
    rows = img[y0] * (1 - ty)[:, None, None] + img[y1] * ty[:, None, None]
    return rows[:, x0] * (1 - tx)[None, :, None] + rows[:, x1] * tx[None, :, None]


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
def test_imresize_bilinear_matches_reference(dtype):
    image = _random_image((13, 17, 3), dtype)
    for out_h, out_w in [(7, 5), (26, 40), (13, 17)]:
        got = mx.image.imresize(nd.array(image, dtype=dtype), out_w, out_h).asnumpy()
        assert got.shape == (out_h, out_w, 3) and got.dtype == np.dtype(dtype)
        expected = _bilinear_reference(image, out_h, out_w)
        if dtype == "uint8":
            assert np.abs(got.astype(np.int64) - np.round(expected)).max() <= 1
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)


def test_imresize_area_and_nearest_on_integer_factors():
    image = _random_image((8, 12, 3), "float32")
    area = mx.image.imresize(nd.array(image), 4, 2, interp=2).asnumpy()
    np.testing.assert_allclose(area, image.reshape(2, 4, 4, 3, 3).mean(axis=(1, 3)), rtol=1e-5)
    nearest = mx.image.imresize(nd.array(image), 4, 2, interp=0).asnumpy()
    np.testing.assert_array_equal(nearest, image[::4, ::3])
    # Every method keeps a constant image constant, enlarging or shrinking.
    flat = np.full((9, 7, 1), 200, dtype=np.uint8)
    for interp in range(5):
        for size in [(3, 4), (20, 11)]:
            out = mx.image.imresize(nd.array(flat, dtype="uint8"), *size, interp=interp).asnumpy()
            assert out.shape == (size[1], size[0], 1) and (out == 200).all(), interp


def test_resize_transform_shapes_batches_and_errors():
    image = nd.array(_random_image((30, 20, 3)), dtype="uint8")
    assert transforms.Resize(15, keep_ratio=True)(image).shape == (22, 15, 3)
    assert transforms.Resize((12, 8))(image).shape == (8, 12, 3)
    batch = nd.array(_random_image((2, 30, 20, 3)), dtype="uint8")
    out = transforms.Resize(10)(batch)
    np.testing.assert_array_equal(out[1].asnumpy(), mx.image.imresize(batch[1], 10, 10).asnumpy())
    for bad in [transforms.Resize(-1), transforms.Resize((1, 2, 3))]:
        with pytest.raises(mx.MXNetError):
            bad(image)
    with pytest.raises(mx.MXNetError, match="interp"):
        mx.image.imresize(image, 5, 5, interp=7)


# --- decoding ----------------------------------------------------------------------------------

def _encode(array, fmt):
    Image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    Image.fromarray(array.squeeze()).save(buffer, format=fmt)
    return buffer.getvalue()


def test_imdecode_png_round_trip_and_flags(tmp_path):
    rgb = _random_image((6, 9, 3))
    data = _encode(rgb, "PNG")
    np.testing.assert_array_equal(mx.image.imdecode(data).asnumpy(), rgb)
    np.testing.assert_array_equal(mx.image.imdecode(data, to_rgb=False).asnumpy(), rgb[:, :, ::-1])
    gray = mx.image.imdecode(data, flag=0).asnumpy()
    assert gray.shape == (6, 9, 1) and gray.dtype == np.uint8
    expected_gray = rgb.astype(np.float64) @ [0.299, 0.587, 0.114]
    assert np.abs(gray[:, :, 0] - expected_gray).max() <= 1
    path = tmp_path / "image.png"
    path.write_bytes(data)
    np.testing.assert_array_equal(mx.image.imread(str(path)).asnumpy(), rgb)
    with pytest.raises(mx.MXNetError):
        mx.image.imdecode(b"not an image")


def test_imdecode_jpeg_is_close():
    smooth = np.tile(np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None], (16, 1, 3))
    decoded = mx.image.imdecode(_encode(smooth, "JPEG")).asnumpy()
    assert decoded.shape == smooth.shape and np.abs(decoded.astype(int) - smooth).mean() < 3


# --- tensor conversion, normalization, crop, flips ----------------------------------------------

def test_to_tensor_and_normalize_match_numpy():
    image = _random_image((5, 4, 3))
    tensor = nd.image.to_tensor(nd.array(image, dtype="uint8"))
    assert tensor.dtype == np.float32
    np.testing.assert_allclose(tensor.asnumpy(), image.transpose(2, 0, 1) / 255.0, rtol=1e-6)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    out = transforms.Normalize(mean, std)(tensor).asnumpy()
    expected = (image.transpose(2, 0, 1) / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(mx.MXNetError, match="mean"):
        nd.image.normalize(nd.ones((4, 2, 2)), mean=(0, 1, 2))


def test_normalize_gradient_divides_by_std():
    x = nd.ones((3, 2, 2))
    x.attach_grad()
    with autograd.record():
        y = nd.image.normalize(x, mean=(1, 2, 3), std=(2, 4, 8))
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy()[:, 0, 0], [0.5, 0.25, 0.125])


def test_crop_forward_backward_and_bounds():
    image = np.arange(5 * 4 * 3, dtype=np.float32).reshape(5, 4, 3)
    x = nd.array(image)
    x.attach_grad()
    with autograd.record():
        y = nd.image.crop(x, x=1, y=2, width=2, height=3)
    np.testing.assert_array_equal(y.asnumpy(), image[2:5, 1:3])
    y.backward(nd.ones_like(y) * 2)
    expected = np.zeros_like(image)
    expected[2:5, 1:3] = 2
    np.testing.assert_array_equal(x.grad.asnumpy(), expected)
    with pytest.raises(mx.MXNetError, match="does not fit"):
        nd.image.crop(x, x=3, y=0, width=2, height=1)


def test_flips_on_images_and_batches():
    batch = _random_image((2, 3, 4, 3))
    np.testing.assert_array_equal(nd.image.flip_left_right(nd.array(batch, dtype="uint8")).asnumpy(), batch[:, :, ::-1])
    np.testing.assert_array_equal(nd.image.flip_top_bottom(nd.array(batch[0], dtype="uint8")).asnumpy(), batch[0, ::-1])
    flipped = {nd.image.random_flip_left_right(nd.array(batch[0], dtype="uint8")).asnumpy().tobytes() for _ in range(40)}
    assert flipped == {batch[0].tobytes(), batch[0, :, ::-1].tobytes()}


# --- colour operators -----------------------------------------------------------------------------

LUMA = np.array([0.299, 0.587, 0.114])


def test_color_operators_with_fixed_factors_match_numpy():
    image = _random_image((4, 5, 3), "float32")
    x = nd.array(image)
    np.testing.assert_allclose(nd.image.random_brightness(x, 1.5, 1.5).asnumpy(), image * 1.5, rtol=1e-5)
    gray_mean = (image @ LUMA).mean()
    np.testing.assert_allclose(nd.image.random_contrast(x, 0.5, 0.5).asnumpy(), image * 0.5 + 0.5 * gray_mean,
                               rtol=1e-5)
    gray = (image @ LUMA)[:, :, None]
    np.testing.assert_allclose(nd.image.random_saturation(x, 0.25, 0.25).asnumpy(), image * 0.25 + 0.75 * gray,
                               rtol=1e-5)
    # A hue turn of zero or of a whole turn leaves the colours as they are.
    for turn in (0.0, 1.0):
        np.testing.assert_allclose(nd.image.random_hue(x, turn, turn).asnumpy(), image, atol=1e-3)
    alpha = np.array([0.1, -0.2, 0.3])
    eigval = np.array([55.46, 4.794, 1.148])
    eigvec = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
    np.testing.assert_allclose(nd.image.adjust_lighting(x, alpha=tuple(alpha)).asnumpy(),
                               image + (eigvec * alpha) @ eigval, rtol=1e-5)


def test_uint8_color_results_saturate():
    bright = nd.image.random_brightness(nd.full((2, 2, 3), 200, dtype="uint8"), 2.0, 2.0)
    assert bright.dtype == np.uint8 and (bright.asnumpy() == 255).all()


def test_random_hue_turns_red_towards_green():
    red = nd.array(np.array([[[255, 0, 0]]], dtype=np.float32))
    out = nd.image.random_hue(red, 1 / 3, 1 / 3).asnumpy()
    np.testing.assert_allclose(out[0, 0], [0, 255, 0], atol=1e-3)


# --- transforms -------------------------------------------------------------------------------

def test_compose_pipeline_runs_hybridized_groups():
    pipeline = transforms.Compose([
        transforms.Resize(40), transforms.CenterCrop(32), transforms.RandomFlipLeftRight(),
        transforms.RandomColorJitter(0.1, 0.1, 0.1, 0.1), transforms.RandomLighting(0.1),
        transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))])
    out = pipeline(nd.array(_random_image((50, 60, 3)), dtype="uint8"))
    assert out.shape == (3, 32, 32) and out.dtype == np.float32
    hybrid_groups = [c for c in pipeline._children.values() if isinstance(c, gluon.nn.HybridSequential)]
    assert len(hybrid_groups) == 1 and hybrid_groups[0]._active


def test_rotate_quarter_turn_matches_rot90():
    image = np.random.RandomState(3).rand(2, 5, 5).astype(np.float32)
    out = transforms.Rotate(90)(nd.array(image)).asnumpy()
    np.testing.assert_allclose(out, np.rot90(image, k=1, axes=(1, 2)), atol=1e-5)
    with pytest.raises(TypeError):
        transforms.Rotate(10)(nd.ones((1, 3, 3), dtype="uint8"))


def test_crop_resize_and_random_resized_crop():
    image = nd.array(_random_image((30, 20, 3)), dtype="uint8")
    out = transforms.CropResize(2, 3, 10, 12, size=(5, 6))(image)
    expected = mx.image.imresize(image[3:15, 2:12], 5, 6)
    np.testing.assert_array_equal(out.asnumpy(), expected.asnumpy())
    assert transforms.RandomResizedCrop((8, 6))(image).shape == (6, 8, 3)


def test_copy_make_border_types():
    image = nd.array(np.arange(6, dtype=np.uint8).reshape(2, 3, 1), dtype="uint8")
    constant = mx.image.copyMakeBorder(image, 1, 0, 0, 2, type=0, value=9).asnumpy()[:, :, 0]
    np.testing.assert_array_equal(constant, [[9, 9, 9, 9, 9], [0, 1, 2, 9, 9], [3, 4, 5, 9, 9]])
    replicate = mx.image.copyMakeBorder(image, 0, 0, 1, 1, type=1).asnumpy()[:, :, 0]
    np.testing.assert_array_equal(replicate, [[0, 0, 1, 2, 2], [3, 3, 4, 5, 5]])


def test_augmenters_produce_requested_shapes():
    augs = mx.image.CreateAugmenter((3, 8, 10), resize=12, rand_crop=True, rand_mirror=True, mean=True, std=True,
                                    brightness=0.1, contrast=0.1, saturation=0.1, hue=0.1, pca_noise=0.1)
    image = nd.array(_random_image((20, 30, 3)), dtype="uint8")
    for aug in augs:
        image = aug(image)
    assert image.shape == (8, 10, 3) and image.dtype == np.float32


# --- datasets and namespaces ---------------------------------------------------------------------

def test_image_folder_dataset(tmp_path):
    for label, name in enumerate(["cat", "dog"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.png").write_bytes(_encode(np.full((4, 3, 3), label * 100, np.uint8), "PNG"))
    dataset = gluon.data.vision.ImageFolderDataset(str(tmp_path))
    assert dataset.synsets == ["cat", "dog"] and len(dataset) == 2
    img, label = dataset[1]
    assert label == 1 and img.shape == (4, 3, 3) and (img.asnumpy() == 100).all()


def test_image_namespaces_in_nd_and_sym():
    assert mx.nd.image.crop is mx.nd._internal._image_crop
    data = mx.sym.var("data")
    sym = mx.sym.image.to_tensor(data)
    _, out_shapes, _ = sym.infer_shape(data=(4, 6, 3))
    assert out_shapes == [(3, 4, 6)]
    _, out_types, _ = sym.infer_type(data=np.uint8)
    assert out_types == [np.float32]


# --- Block.save / Block.load --------------------------------------------------------------------

def test_block_save_load_restores_names_graphs_and_parameters(tmp_path):
    class Chain(gluon.nn.Block):
        def forward(self, x):
            for block in self._children.values():
                x = block(x)
            return x

    def build():
        net = Chain()
        net.register_child(gluon.nn.Dense(4), "first")
        net.register_child(gluon.nn.Dense(2), "second")
        return net

    net = build()
    net.initialize()
    net.hybridize()
    x = nd.ones((3, 5))
    expected = net(x).asnumpy()
    prefix = str(tmp_path / "model")
    net.save(prefix)
    assert os.path.exists(prefix + "-model.json") and os.path.exists(prefix + "-model.params")
    restored = build()
    restored.load(prefix)
    assert [c.name for c in restored._children.values()] == [c.name for c in net._children.values()]
    np.testing.assert_allclose(restored(x).asnumpy(), expected, rtol=1e-6)
