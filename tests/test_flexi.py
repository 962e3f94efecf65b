"""Patch-size resize (FlexiViT's PI-resize) against timm.

`resize_patch_embedding` is compared with `timm.layers.resample_patch_embed` (torch's
F.interpolate inverted by a pseudo-inverse), and a checkpoint loaded at another patch size with
timm's own model built at that patch size and fed the same checkpoint through timm's
`checkpoint_filter_fn` (which resamples the patch embedding and the position embeddings).
"""

import sys

import numpy as np
import pytest
from conftest import TINY, TINY_HYBRID, randomize, rel_err

import keras_vit
from keras_vit.models.weight_tree import WeightTreeError

# TensorFlow and triton's bundled LLVM clash in one process (a segfault when triton loads after
# TensorFlow); the torch references here run on CPU and never need triton.
sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")


def _timm_resample(kernel, new, interpolation="bicubic", antialias=True):
    from timm.layers import resample_patch_embed

    weight = torch.from_numpy(kernel.transpose(3, 2, 0, 1).copy())  # HWIO -> (out, in, h, w)
    out = resample_patch_embed(weight, list(new), interpolation=interpolation, antialias=antialias)
    return out.numpy().transpose(2, 3, 1, 0)


# (old kernel (h, w), new patch): down, up, not a divisor, up from 14, non-square both ways.
CASES = [((16, 16), 8), ((16, 16), 32), ((16, 16), 12), ((14, 14), 16), ((16, 16), (10, 24)), ((12, 16), 8)]


def test_resize_patch_embedding_is_timm_resample_patch_embed():
    rng = np.random.default_rng(0)
    errors = {}
    for old, new in CASES:
        # Scaled like a trained ViT's patch embedding (lecun normal for 16x16x3 inputs).
        kernel = (rng.standard_normal((*old, 3, 24)) / np.sqrt(old[0] * old[1] * 3)).astype("float32")
        out = keras_vit.resize_patch_embedding(kernel, new)
        ref = _timm_resample(kernel, (new, new) if isinstance(new, int) else new)
        assert out.shape == ref.shape and out.dtype == np.float32
        errors[old, new] = np.abs(out - ref).max()
        # Measured 8e-8 to 4.5e-7 (float64 pseudo-inverse against torch's float32 one); the
        # kernel's entries are about 0.04, so a wrong rule is off by far more.
        assert errors[old, new] < 5e-6, (old, new, errors[old, new])


def test_other_rules_are_torch_interpolate():
    kernel = np.random.default_rng(1).standard_normal((8, 8, 3, 8)).astype("float32") * 0.05
    for rule, interpolation, antialias in [("bilinear_antialias", "bilinear", True), ("bilinear", "bilinear", False)]:
        for new in (4, 12, (6, 10)):
            pair = (new, new) if isinstance(new, int) else new
            ref = _timm_resample(kernel, pair, interpolation, antialias)
            out = keras_vit.resize_patch_embedding(kernel, new, rule=rule)
            # Measured 6e-8 to 3.1e-7.
            np.testing.assert_allclose(out, ref, rtol=0, atol=3e-6, err_msg=f"{rule} {new}")


def test_upsampled_kernel_gives_the_same_token_for_the_resized_patch():
    # The defining property when the new patch is larger (B has full column rank):
    # <resize(x), w_new> = <x, w_old> for every patch x, with resize = torch's antialiased bicubic.
    import torch.nn.functional as F

    rng = np.random.default_rng(2)
    kernel = rng.standard_normal((8, 8, 3, 5)).astype("float32")
    new = keras_vit.resize_patch_embedding(kernel, 16)
    x = rng.standard_normal((4, 8, 8, 3)).astype("float32")
    resized = F.interpolate(torch.from_numpy(x.transpose(0, 3, 1, 2)), size=(16, 16), mode="bicubic", antialias=True)
    resized = resized.numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(
        np.einsum("bhwc,hwcd->bd", resized, new), np.einsum("bhwc,hwcd->bd", x, kernel), rtol=0, atol=1e-4
    )


def test_same_size_and_bad_input():
    kernel = np.ones((16, 16, 3, 4), "float32")
    np.testing.assert_array_equal(keras_vit.resize_patch_embedding(kernel, 16), kernel)
    with pytest.raises(ValueError, match=r"\(patch_h, patch_w, in_channels, hidden\).*transpose"):
        keras_vit.resize_patch_embedding(kernel[0], 8)
    with pytest.raises(ValueError, match="new_patch_size must be a positive int"):
        keras_vit.resize_patch_embedding(kernel, 0)
    with pytest.raises(ValueError, match="Unknown patch-embedding resize rule 'nearest'"):
        keras_vit.resize_patch_embedding(kernel, 8, rule="nearest")


def _save_timm(arch, folder, seed=0, **kwargs):
    from timm.models._hub import save_for_hf

    model = timm.create_model(arch, pretrained=False, **kwargs)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
    save_for_hf(model.eval(), folder, safe_serialization=True)
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _timm_at(arch, state, x, **kwargs):
    """timm's logits for checkpoint `state` run by a model built with `kwargs` (e.g. patch_size=8),
    the checkpoint fitted to it by timm's own `checkpoint_filter_fn`."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    model = timm.create_model(arch, pretrained=False, **kwargs).eval()
    model.load_state_dict(checkpoint_filter_fn(dict(state), model))
    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2)).contiguous()).numpy()


def test_load_checkpoint_at_another_patch_size_matches_timm(tmp_path):
    arch = "vit_tiny_patch16_224"
    state = _save_timm(arch, tmp_path / "t", depth=2, img_size=64)
    rng = np.random.default_rng(3)
    # (patch, image size): 16 -> 8 (grid 4x4 -> 8x8), 16 -> 32 (2x2), 16 -> 12 at 48 (grid kept,
    # only the kernel changes), 16 -> 8 at a non-square size (grid 6x8).
    for patch, size in [(8, 64), (32, 64), (12, 48), (8, (48, 64))]:
        hw = (size, size) if isinstance(size, int) else size
        x = rng.uniform(-1, 1, (2, *hw, 3)).astype("float32")
        model = keras_vit.load_checkpoint(tmp_path / "t", patch_size=patch, image_size=None if size == 64 else size)
        assert model.patch_size == patch and model.grid_size == (hw[0] // patch, hw[1] // patch)
        ref = _timm_at(arch, state, x, depth=2, img_size=size, patch_size=patch)
        # Measured 1.3e-6 to 2.1e-6 (JAX, against timm on contiguous tensors).
        assert rel_err(model.predict(x, verbose=0), ref) < 2e-5, (patch, size)


def test_constructor_weights_at_another_patch_size(tmp_path):
    # The full-size ViT-Ti/16 (the constructor checks the checkpoint is its architecture) at a
    # small image, run at patch 8.
    arch = "vit_tiny_patch16_224"
    state = _save_timm(arch, tmp_path / "t", seed=1, img_size=32)
    x = np.random.default_rng(4).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model = keras_vit.ViTTi16(weights=str(tmp_path / "t"), patch_size=8, input_shape=(32, 32, 3),
                              classifier_activation=None)
    assert model.patch_size == 8 and model.grid_size == (4, 4)
    ref = _timm_at(arch, state, x, img_size=32, patch_size=8)
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5  # measured 1.2e-6


def test_refusals_say_why(tmp_path):
    # A hybrid's checkpoint config (the refusal comes before anything is built or read).
    hybrid_config = keras_vit.ViTConfig(**TINY_HYBRID).architecture()
    with pytest.raises(ValueError, match="hybrid: its patch embedding reads ResNet features, not pixels"):
        keras_vit.build_model({}, hybrid_config, patch_size=2, source="hybrid.npz")
    plain = randomize(keras_vit.VisionTransformer(**TINY))  # 32x32 images, patch 8
    keras_vit.save_preset(plain, tmp_path / "plain")
    with pytest.raises(ValueError, match=r"square patches.*resize_patch_embedding"):
        keras_vit.load_checkpoint(tmp_path / "plain", patch_size=(4, 8))
    with pytest.raises(ValueError, match=r"patch_size=12 does not divide the image size 32x32 \(the checkpoint's\)\. "
                                         r"Pass an image_size that it divides as well, e\.g\. image_size=24 or 36"):
        keras_vit.load_checkpoint(tmp_path / "plain", patch_size=12)
    # The same weights built at another patch size without asking for the resize: a clear error.
    other = keras_vit.VisionTransformer(**dict(TINY, patch_size=4))
    with pytest.raises(WeightTreeError, match="load them with patch_size=4"):
        keras_vit.set_weight_tree(other, keras_vit.get_weight_tree(plain))
    # Asked for: the position embeddings follow the new grid, with the model's own rule.
    model = keras_vit.load_checkpoint(tmp_path / "plain", patch_size=4)
    tree = keras_vit.get_weight_tree(model)
    kernel = keras_vit.get_weight_tree(plain)["embedding/kernel"]
    np.testing.assert_allclose(tree["embedding/kernel"], keras_vit.resize_patch_embedding(kernel, 4))
    expected = keras_vit.resize_position_embedding(
        keras_vit.get_weight_tree(plain)["Transformer/posembed_input/pos_embedding"], (8, 8), rule="original"
    )
    np.testing.assert_allclose(tree["Transformer/posembed_input/pos_embedding"], expected, rtol=0, atol=1e-7)
