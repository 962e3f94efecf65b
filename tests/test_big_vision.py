"""big_vision ViT .npz files against a NumPy reference of big_vision's own forward pass.

The tests write random parameters under big_vision's names (per-class Flax counters, top-level
`pos_embedding`, scanned blocks, `params/` and `params/img/` prefixes) with NumPy, and compare
`keras_vit.load_checkpoint` with `reference_numpy.big_vision_forward`, which reads those names
directly (it shares nothing with the reader's renaming).
"""

import os

import keras
import numpy as np
import pytest
import scipy.ndimage
from conftest import randomize
from reference_numpy import big_vision_forward

import keras_vit
from keras_vit.checkpoints import CheckpointError, detect_format, write_big_vision_npz, write_npz
from keras_vit.layers.init_scope import skip_random_init

WIDTH, DEPTH, HEADS, MLP, PATCH, IMAGE, CLASSES = 32, 2, 4, 64, 8, 32, 5
#: Relative to the largest logit, about 10x the measured error (JAX: 1.8e-7 to 3.9e-7 over the
#: cases below), so that big_vision's numerics are what passes: LayerNorm eps 1e-5 instead of
#: flax's 1e-6 measures 8e-6 to 3e-5 and fails every case.
TOL = 4e-6


def big_vision_params(seed=0, *, pool_type="tok", posemb="learn", rep_size=None, classes=CLASSES, grid=IMAGE // PATCH):
    """Random parameters of a tiny big_vision ViT, flat and '/'-joined as its .npz files are."""
    r = np.random.default_rng(seed)
    hd = WIDTH // HEADS

    def normal(*shape, scale=None):
        scale = scale if scale is not None else 1 / np.sqrt(shape[0] if len(shape) > 1 else 4)
        return (r.standard_normal(shape) * scale).astype(np.float32)

    def attention(p):
        out = {}
        for name in ("query", "key", "value"):
            out[f"{p}/{name}/kernel"] = normal(WIDTH, HEADS, hd)
            out[f"{p}/{name}/bias"] = normal(HEADS, hd, scale=0.1)
        out[f"{p}/out/kernel"] = normal(HEADS, hd, WIDTH, scale=1 / np.sqrt(WIDTH))
        out[f"{p}/out/bias"] = normal(WIDTH, scale=0.1)
        return out

    def norm(p):
        return {f"{p}/scale": 1 + normal(WIDTH, scale=0.1), f"{p}/bias": normal(WIDTH, scale=0.1)}

    def mlp(p):
        return {f"{p}/Dense_0/kernel": normal(WIDTH, MLP), f"{p}/Dense_0/bias": normal(MLP, scale=0.1),
                f"{p}/Dense_1/kernel": normal(MLP, WIDTH), f"{p}/Dense_1/bias": normal(WIDTH, scale=0.1)}

    params = {"embedding/kernel": normal(PATCH, PATCH, 3, WIDTH, scale=0.05),
              "embedding/bias": normal(WIDTH, scale=0.1)}
    if posemb == "learn":
        params["pos_embedding"] = normal(1, grid * grid, WIDTH, scale=0.5)
    if pool_type == "tok":
        params["cls"] = normal(1, 1, WIDTH, scale=0.5)
    for i in range(DEPTH):
        b = f"Transformer/encoderblock_{i}"
        params.update({**norm(f"{b}/LayerNorm_0"), **attention(f"{b}/MultiHeadDotProductAttention_0"),
                       **norm(f"{b}/LayerNorm_1"), **mlp(f"{b}/MlpBlock_0")})
    params.update(norm("Transformer/encoder_norm"))
    if pool_type == "map":
        params["MAPHead_0/probe"] = normal(1, 1, WIDTH, scale=0.5)
        params.update({**attention("MAPHead_0/MultiHeadDotProductAttention_0"), **norm("MAPHead_0/LayerNorm_0"),
                       **mlp("MAPHead_0/MlpBlock_0")})
    features = WIDTH
    if rep_size:
        params.update({"pre_logits/kernel": normal(WIDTH, rep_size), "pre_logits/bias": normal(rep_size, scale=0.1)})
        features = rep_size
    if classes:
        params.update({"head/kernel": normal(features, classes), "head/bias": normal(classes, scale=0.1)})
    return params


def scanned(params):
    """big_vision's `pyloop_to_scan`: the blocks stacked into one `Transformer/encoderblock`."""
    out = {k: v for k, v in params.items() if not k.startswith("Transformer/encoderblock_")}
    for key in [k for k in params if k.startswith("Transformer/encoderblock_0/")]:
        sub = key.split("/", 2)[2]
        layers = [params[f"Transformer/encoderblock_{i}/{sub}"] for i in range(DEPTH)]
        out[f"Transformer/encoderblock/{sub}"] = np.stack(layers)
    return out


def save(params, path, prefix=""):
    np.savez(path, **{prefix + k: v for k, v in params.items()})
    return str(path)


def images(size=IMAGE, seed=1):
    h, w = (size, size) if isinstance(size, int) else size
    return np.random.default_rng(seed).uniform(-1, 1, (2, h, w, 3)).astype(np.float32)


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def relative_error(got, want):
    got, want = numpy(got), numpy(want)
    return float(np.abs(got - want).max() / np.abs(want).max())


def check(path, reference, *, image_size=None, **load_kwargs):
    model = keras_vit.load_checkpoint(path, image_size=image_size, **load_kwargs)
    x = images(image_size or IMAGE)
    got = keras.ops.convert_to_numpy(model(x))
    want = reference(x)
    assert got.shape == want.shape
    err = relative_error(got, want)
    assert err < TOL, err
    return model, err


# === Forward pass against the reference, per pool type and layout ===

CASES = {
    # name: (pool_type, params kwargs, load kwargs, layout: "plain" | "scan" | prefix)
    "tok": ("tok", {}, {}, "plain"),
    "gap": ("gap", {}, {}, "plain"),
    "map": ("map", {}, {}, "plain"),
    "0": ("0", {}, dict(classifier="first"), "plain"),
    "none": ("none", {}, dict(classifier="none"), "plain"),
    "sincos2d_tok": ("tok", dict(posemb="sincos2d"), dict(image_size=IMAGE), "plain"),
    "pre_logits_gap": ("gap", dict(rep_size=24), {}, "plain"),
    "scanned_map": ("map", {}, {}, "scan"),
    "scanned_tok_pre_logits": ("tok", dict(rep_size=24), {}, "scan"),
    "params_prefix_tok": ("tok", {}, {}, "params/"),
    # No head: the model as the file is (include_top=None) pools as the named classifier does.
    "0_features": ("0", dict(classes=None), dict(classifier="first", include_top=None), "plain"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_big_vision(case, tmp_path):
    pool_type, param_kw, load_kw, layout = CASES[case]
    params = big_vision_params(pool_type=pool_type, **param_kw)
    stored = scanned(params) if layout == "scan" else params
    path = save(stored, tmp_path / "bv.npz", prefix=layout if layout.endswith("/") else "")
    assert detect_format(path).name == "big_vision"
    head = param_kw.get("classes", CLASSES) is not None
    reference = lambda x: big_vision_forward(params, x, pool_type=pool_type, include_head=head)  # noqa: E731
    _, err = check(path, reference, **load_kw)
    # The bound tells big_vision's LayerNorm eps (flax's 1e-6) from 1e-5.
    wrong = keras_vit.load_checkpoint(path, layer_norm_epsilon=1e-5, **load_kw)
    x = images(load_kw.get("image_size") or IMAGE)
    wrong_err = relative_error(wrong(x), reference(x))
    print(f"{case}: max relative error {err:.2e}; with LayerNorm eps 1e-5: {wrong_err:.2e}")
    assert wrong_err > TOL, wrong_err


def test_image_tower_of_a_two_tower_model(tmp_path):
    """SigLIP/LiT files: the image tower under params/img/ (MAP pooling, no classifier head),
    beside a text tower and the temperature/bias scalars, which are left alone."""
    params = big_vision_params(pool_type="map", classes=None)
    others = {"params/txt/Embed_0/embedding": np.ones((11, WIDTH), np.float32), "params/t": np.ones((1,), np.float32),
              "params/b": np.zeros((1,), np.float32)}
    path = str(tmp_path / "siglip.npz")
    np.savez(path, **{f"params/img/{k}": v for k, v in params.items()}, **others)
    tree, config = keras_vit.read_checkpoint(path)
    assert config["classes"] is None and config["classifier"] == "map"
    model, err = check(path, lambda x: big_vision_forward(params, x, pool_type="map", include_head=False),
                       include_top=None)
    assert model.output_shape == (None, WIDTH)
    print(f"params/img/: max relative error {err:.2e}")


def test_other_resolution_resizes_like_big_vision(tmp_path):
    """At 48 px (a 6x6 grid from the stored 4x4) the embedding is resized as big_vision's
    `resample_posemb` does (scipy.ndimage.zoom, order=1), the class token left without one."""
    params = big_vision_params(pool_type="tok")
    path = save(params, tmp_path / "bv.npz")
    grid = params["pos_embedding"].reshape(4, 4, WIDTH).astype(np.float64)
    resized = dict(params, pos_embedding=scipy.ndimage.zoom(grid, (1.5, 1.5, 1), order=1).reshape(1, 36, WIDTH))
    _, err = check(path, lambda x: big_vision_forward(resized, x, pool_type="tok"), image_size=48)
    print(f"resized 32 -> 48: max relative error {err:.2e}")


def test_old_checkpoint_layouts(tmp_path):
    """What big_vision's `fix_old_checkpoints` repairs: the embedding in `Transformer/posembed_input/`
    that also covers the class token (the old order: prepend, then add), and a MAP head inlined
    at the top level."""
    params = big_vision_params(pool_type="tok")
    old = {k: v for k, v in params.items() if k != "pos_embedding"}
    cls_row = np.random.default_rng(5).standard_normal((1, 1, WIDTH)).astype(np.float32)
    old["Transformer/posembed_input/pos_embedding"] = np.concatenate([cls_row, params["pos_embedding"]], axis=1)
    path = save(old, tmp_path / "old_tok.npz")
    fixed = dict(params, cls=params["cls"] + cls_row)  # big_vision's fix: the row joins the class token
    model, err = check(path, lambda x: big_vision_forward(fixed, x, pool_type="tok"))
    assert model.config.class_token_position_embedding  # the old order is the original one
    print(f"old combined cls+posemb: max relative error {err:.2e}")

    params = big_vision_params(pool_type="map")
    inlined = {k.replace("MAPHead_0/", ""): v for k, v in params.items()}
    inlined["Transformer/pos_embedding"] = inlined.pop("pos_embedding")
    path = save(inlined, tmp_path / "old_map.npz")
    _, err = check(path, lambda x: big_vision_forward(params, x, pool_type="map"))
    print(f"old inlined MAP head: max relative error {err:.2e}")


def test_reading_is_lazy_and_unscans_per_layer(tmp_path):
    """The reader's tree holds LazyArrays (shapes known, nothing read); a scanned file gives each
    block its slice of the stacked arrays, stored or compressed, and what else a training
    checkpoint holds beside `params/` (optimizer state) is left alone."""
    from keras_vit.storage.lazy import LazyArray
    from keras_vit.checkpoints.registry import get_format

    params = big_vision_params(pool_type="map")
    stacked = scanned(params)
    extra = {"opt/state/mu/embedding/kernel": np.zeros(3, np.float32), "step": np.zeros((), np.float32)}
    for name, writer in (("stored", np.savez), ("compressed", np.savez_compressed)):
        path = str(tmp_path / f"{name}.npz")
        writer(path, **{f"params/{k}": v for k, v in stacked.items()}, **extra)
        tree, config = get_format("big_vision").read(path)
        assert all(isinstance(v, LazyArray) for v in tree.values())
        inferred = config["num_layers"], config["num_heads"], config["mlp_dim"], config["classifier"]
        assert inferred == (DEPTH, HEADS, MLP, "map")
        key = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel"
        assert tree[key].shape == (WIDTH, HEADS, WIDTH // HEADS)
        np.testing.assert_array_equal(np.asarray(tree[key]),
                                      params["Transformer/encoderblock_1/MultiHeadDotProductAttention_0/query/kernel"])
        np.testing.assert_array_equal(np.asarray(tree["Transformer/encoderblock_0/MlpBlock_3/Dense_1/bias"]),
                                      params["Transformer/encoderblock_0/MlpBlock_0/Dense_1/bias"])


# === Writing, saving and the model options ===


def test_writer_round_trip_and_keras_save(tmp_path):
    """A keras_vit model written in big_vision's layout (scanned, under params/) reads back with
    equal logits; the original layout's class-token embedding row is folded into `cls`. A
    model loaded from big_vision writes back to the original layout, and saves as .keras and
    reloads, with equal logits."""
    with skip_random_init():  # random values follow (on JAX, random initialisers compile per shape)
        model = randomize(keras_vit.VisionTransformer(
            image_size=IMAGE, patch_size=PATCH, hidden_size=WIDTH, num_layers=DEPTH, num_heads=HEADS, mlp_dim=MLP,
            classes=CLASSES, representation_size=16, classifier_activation=None), seed=3)
    path = write_big_vision_npz(model, str(tmp_path / "written.npz"), prefix="params/", scan=True)
    with np.load(path) as f:
        assert f["params/pos_embedding"].shape == (1, 16, WIDTH)
        assert f["params/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"].shape == (DEPTH, WIDTH, MLP)
    loaded = keras_vit.load_checkpoint(path)
    assert not loaded.config.class_token_position_embedding
    x = images()
    want = model(x)
    err = relative_error(loaded(x), want)
    assert err < TOL, err
    print(f"written as big_vision (scanned, params/): max relative error {err:.2e}")

    # Back to the original layout: the class token's embedding row is written as zeros.
    original = keras_vit.load_checkpoint(write_npz(loaded, str(tmp_path / "original.npz")))
    assert original.config.class_token_position_embedding
    err = relative_error(original(x), want)
    assert err < TOL, err
    print(f"big_vision model written as original .npz: max relative error {err:.2e}")

    loaded.save(tmp_path / "m.keras")
    with skip_random_init():  # the saved weights follow
        again = keras.saving.load_model(tmp_path / "m.keras")
    assert again.get_config() == loaded.get_config()
    np.testing.assert_allclose(numpy(again(x)), numpy(loaded(x)), rtol=0, atol=1e-6)


def test_original_npz_is_not_claimed(tmp_path):
    with skip_random_init():
        model = keras_vit.VisionTransformer(image_size=IMAGE, patch_size=PATCH, hidden_size=WIDTH, num_layers=1,
                                            num_heads=HEADS, mlp_dim=MLP, classes=3)
    path = write_npz(model, str(tmp_path / "original.npz"))
    assert detect_format(path).name == "npz"


@pytest.fixture
def no_random_init():
    with skip_random_init():  # the test looks at shapes and configs only
        yield


def test_model_options_build_and_round_trip(no_random_init):
    """classifier="first" (no class token, the first patch token read out), classifier="none"
    (the head on every token) and a class token without a position embedding."""
    kw = dict(image_size=IMAGE, patch_size=PATCH, hidden_size=WIDTH, num_layers=1, num_heads=HEADS, mlp_dim=MLP,
              classes=3)
    none = keras_vit.VisionTransformer(**kw, classifier="none")
    assert none.output_shape == (None, 16, 3) and none.num_prefix_tokens == 0
    first = keras_vit.VisionTransformer(**kw, classifier="first", representation_size=8)
    assert first.output_shape == (None, 3)
    token = keras_vit.VisionTransformer(**kw, class_token_position_embedding=False)
    assert token.get_layer("posembed_input").pos_embedding.shape == (1, 16, WIDTH)
    for model in (none, first, token):
        rebuilt = keras_vit.VisionTransformer.from_config(model.get_config())
        assert rebuilt.config == model.config and rebuilt.count_params() == model.count_params()
    features = keras_vit.VisionTransformer(**kw, classifier="first", include_top=False, pooling="first")
    assert features.output_shape == (None, WIDTH)


# === Hostile and damaged files ===


def test_damaged_files_raise_clear_errors(tmp_path):
    params = big_vision_params(pool_type="tok")
    path = save(params, tmp_path / "bv.npz")
    data = open(path, "rb").read()

    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        keras_vit.load_checkpoint(str(truncated))

    missing = save({k: v for k, v in params.items() if k != "Transformer/encoder_norm/scale"}, tmp_path / "m1.npz")
    with pytest.raises(CheckpointError, match="missing weights: Transformer/encoder_norm/scale"):
        keras_vit.load_checkpoint(missing)
    query = "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"
    missing = save({k: v for k, v in params.items() if k != query}, tmp_path / "m2.npz")
    with pytest.raises(CheckpointError, match=f"missing weight '{query}'"):
        keras_vit.load_checkpoint(missing)

    stacked = scanned(params)
    stacked["Transformer/encoderblock/LayerNorm_1/bias"] = np.zeros((DEPTH + 1, WIDTH), np.float32)
    with pytest.raises(CheckpointError, match="disagree on the number of layers"):
        keras_vit.load_checkpoint(save(stacked, tmp_path / "depth.npz"))

    odd = save({**params, "Transformer/encoderblock_1/Dropout_0/rate": np.zeros(1, np.float32)}, tmp_path / "odd.npz")
    with pytest.raises(CheckpointError, match="unexpected weight.*Dropout_0"):
        keras_vit.load_checkpoint(odd)

    ints = save({**params, "cls": np.zeros((1, 1, WIDTH), np.int32)}, tmp_path / "ints.npz")
    with pytest.raises(CheckpointError, match="'cls' has dtype int32; expected floats"):
        keras_vit.load_checkpoint(ints)

    nan = dict(stacked, **{"Transformer/encoderblock/LayerNorm_1/bias": np.full((DEPTH, WIDTH), np.nan, np.float32)})
    with pytest.raises(CheckpointError, match="non-finite"):
        keras_vit.load_checkpoint(save(nan, tmp_path / "nan.npz"))
    assert os.path.exists(path)


# === Grids that are not square, big_vision's patch resize, scanned files' CRC ===


def _with_grid(params, rows, cols, seed=7):
    pos = np.random.default_rng(seed).standard_normal((1, rows * cols, WIDTH)).astype(np.float32) * 0.5
    return dict(params, pos_embedding=pos)


def test_a_grid_that_is_not_square_loads_at_its_own_size(tmp_path):
    """big_vision uses a stored embedding unchanged when its shape is the model's
    (`resample_posemb`): a 4x6 grid loads at image_size=(32, 48); without an image size the grid
    is ambiguous and refused with a message that asks for one."""
    params = _with_grid(big_vision_params(pool_type="gap"), 4, 6)
    path = save(params, tmp_path / "wide.npz")
    model, err = check(path, lambda x: big_vision_forward(params, x, pool_type="gap"), image_size=(32, 48))
    assert model.grid_size == (4, 6)
    with pytest.raises(CheckpointError, match=r"24 tokens, not a square grid.*Pass image_size=\(height, width\)"):
        keras_vit.load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"Pass image_size"):
        keras_vit.load_checkpoint(path, image_size=64)  # 8x8: not the stored grid, which is not square
    tree, config = keras_vit.read_checkpoint(path, image_size=(32, 48))
    assert config["image_size"] == (32, 48) and tree["Transformer/posembed_input/pos_embedding"].shape == (1, 24, WIDTH)
    print(f"4x6 grid: max relative error {err:.2e}")


def test_a_class_token_file_on_a_grid_of_n_squared_plus_one_cells(tmp_path):
    """A `tok` file on a 2x5 grid holds 10 = 3^2 + 1 embeddings: also the count of the old layout
    (a class-token row, then 3x3). The image size tells them apart; without one it is refused,
    not read as the old layout."""
    params = _with_grid(big_vision_params(pool_type="tok"), 2, 5)
    path = save(params, tmp_path / "tok_2x5.npz")
    _, err = check(path, lambda x: big_vision_forward(params, x, pool_type="tok"), image_size=(16, 40))
    with pytest.raises(CheckpointError, match=r"10 tokens, either the old layout \(3x3 patches after a class-token "
                                              r"row\) or a 2x5 grid"):
        keras_vit.read_checkpoint(path)
    # The same count stored where the old code kept it is the old layout (test_old_checkpoint_layouts),
    # and at an image size of 3x3 patches the top-level one is too.
    cls_row, grid = params["pos_embedding"][:, :1], params["pos_embedding"][:, 1:]
    old = dict(params, cls=params["cls"] + cls_row, pos_embedding=grid)
    _, err_old = check(path, lambda x: big_vision_forward(old, x, pool_type="tok"), image_size=24)
    print(f"2x5 tok: max relative error {err:.2e}; read at 3x3 as the old layout: {err_old:.2e}")


def _big_vision_pi_resize(kernel, new):
    """big_vision's FlexiViT `resample_patchemb`, written out: the matrix of tf.image.resize
    (bilinear, no antialias) applied to every basis image, its transpose pseudo-inverted."""
    import tensorflow as tf

    old = kernel.shape[:2]
    basis = np.eye(old[0] * old[1]).reshape(-1, old[0], old[1], 1)
    resized = tf.image.resize(basis, new, method="bilinear").numpy().reshape(len(basis), -1)  # (old cells, new cells)
    pinv = np.linalg.pinv(resized)  # (new cells, old cells)
    flat = kernel.reshape(old[0] * old[1], -1).astype(np.float64)
    return (pinv @ flat).reshape(*new, *kernel.shape[2:]).astype(np.float32)


@pytest.mark.parametrize("patch,image", [(4, 16), (12, 48)])
def test_another_patch_size_uses_big_visions_resize(patch, image, tmp_path):
    """load_checkpoint(big_vision_file, patch_size=...) PI-resizes the kernel as big_vision's
    FlexiViT does (bilinear), not as timm does (bicubic, antialiased), unless told otherwise.
    The grid stays 4x4, so only the kernel changes."""
    params = big_vision_params(pool_type="tok")
    path = save(params, tmp_path / "bv.npz")
    resized = dict(params, **{"embedding/kernel": _big_vision_pi_resize(params["embedding/kernel"], (patch, patch))})
    model, err = check(path, lambda x: big_vision_forward(resized, x, pool_type="tok"), image_size=image,
                       patch_size=patch)
    assert model.patch_size == patch and model.grid_size == (4, 4)
    timm_rule = keras_vit.load_checkpoint(path, image_size=image, patch_size=patch,
                                          patch_resize_rule="bicubic_antialias")
    x = images(image)
    other = relative_error(timm_rule(x), big_vision_forward(resized, x, pool_type="tok"))
    assert other > 100 * TOL, other  # the two rules are far apart: the test tells them apart
    print(f"patch 8 -> {patch}: max relative error {err:.2e}; with timm's rule {other:.2e}")


def test_a_flipped_byte_in_a_scanned_kernel_is_refused(tmp_path):
    """Each layer's slice of a scanned array is read on its own; the zip's CRC-32 of the whole
    member is checked first, as for a per-layer file."""
    stacked = scanned(big_vision_params(pool_type="gap"))
    path = save(stacked, tmp_path / "scanned.npz")
    data = bytearray(open(path, "rb").read())
    kernel = stacked["Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"]
    start = bytes(data).index(kernel[1].tobytes()[:64])  # inside layer 1's slice
    data[start + 10] ^= 0x04
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC"):
        keras_vit.load_checkpoint(str(damaged))
