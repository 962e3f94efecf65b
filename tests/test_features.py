"""Dense features (`forward_intermediates`, `feature_extractor`, `feature_info`) against timm's
`forward_intermediates`, and the ViTDet simple feature pyramid against its formulas.

ViT-B/16, DeiT-III-S (layer scale, no class-token position embedding) and DINOv2-S/14 with 4
registers: random-weight timm models at tiny image sizes (depth 3), saved as timm saves a Hub
repo and read through keras_vit's timm reader. Their intermediates (every index form, normed or
not, prefix tokens split off) and final features equal timm's within max(2e-5, twice timm's own
float32 error against float64), relative to each output's scale.
"""

import sys

import keras
import numpy as np
import pytest

import keras_vit

sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

from test_timm_zoo import randomize_torch  # noqa: E402

# (case, timm architecture, create_model overrides)
CASES = [
    ("vit_b16", "vit_base_patch16_224", dict(img_size=32)),
    ("deit3_small", "deit3_small_patch16_224", dict(img_size=32)),
    ("dinov2_small_reg4", "vit_small_patch14_reg4_dinov2", dict(img_size=28)),
]
DEPTH = 3
# {case: [(indices, norm, return_prefix_tokens, output)]}: timm's forms of `indices`, normed or not,
# prefix tokens split off or dropped, both formats.
CALLS = {
    "vit_b16": [(None, False, True, "nhwc"), ([0, -1], True, False, "tokens")],
    "deit3_small": [(2, True, True, "nhwc"), ([1], False, True, "tokens")],
    "dinov2_small_reg4": [(None, True, True, "nhwc"), ([0, -1], False, True, "tokens")],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{case: (keras_vit model, timm model)}, each read from timm's own Hub layout."""
    from timm.models._hub import save_for_hf

    out = {}
    for seed, (case, arch, overrides) in enumerate(CASES):
        args = dict(depth=DEPTH, **overrides)
        ref = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=seed)
        folder = tmp_path_factory.mktemp(case)
        save_for_hf(ref, folder, safe_serialization=True, model_args=args)
        out[case] = (keras_vit.load_checkpoint(folder, include_top=False), ref)
    return out


def _timm_intermediates(ref, x, indices, norm, prefix, output):
    """timm's (final, intermediates) in float32 and float64, as NumPy float64, channels last."""
    results = []
    for dtype in (torch.float32, torch.float64):
        m = ref.to(dtype)
        with torch.no_grad():
            images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(dtype)
            final, inter = m.forward_intermediates(
                images, indices=indices, norm=norm, return_prefix_tokens=prefix,
                output_fmt="NCHW" if output == "nhwc" else "NLC",
            )

        def as_numpy(t):
            t = t.double().numpy()
            return t.transpose(0, 2, 3, 1) if t.ndim == 4 else t

        inter = [[as_numpy(p) for p in item] if isinstance(item, tuple) else as_numpy(item) for item in inter]
        results.append((as_numpy(final), inter))
    ref.to(torch.float32)
    return results


def _flat(structure):
    return [np.asarray(keras.ops.convert_to_numpy(t), np.float64) for t in keras.tree.flatten(structure)]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_intermediates_equal_timm(models, case):
    model, ref = models[case]
    x = np.random.default_rng(3).uniform(-1, 1, (2, *model.config.image_size, 3)).astype("float32")
    for indices, norm, prefix, output in CALLS[case]:
        (final32, inter32), (final64, inter64) = _timm_intermediates(ref, x, indices, norm, prefix, output)
        final, inter = model.forward_intermediates(
            x, indices, norm=norm, return_prefix_tokens=prefix, output=output)
        ours, want32, want64 = _flat([final, inter]), _flat([final32, inter32]), _flat([final64, inter64])
        assert [o.shape for o in ours] == [w.shape for w in want64], (case, indices)
        for got, w32, w64 in zip(ours, want32, want64):
            scale = np.abs(w64).max()
            timm_error = np.abs(w32 - w64).max() / scale
            error = np.abs(got - w64).max() / scale
            assert error <= max(2e-5, 2 * timm_error), (case, indices, norm, error, timm_error)


def test_feature_info_equals_timm(models):
    for case, (model, ref) in models.items():
        ours = [(f["channels"], f["reduction"]) for f in model.feature_info]
        assert ours == [(f["num_chs"], f["reduction"]) for f in ref.feature_info], case
        assert [f["layer"] for f in model.feature_info] == [f"encoderblock_{i}" for i in range(DEPTH)]


class _ChannelNorm(torch.nn.Module):
    """detectron2's LayerNorm over the channels of an NCHW map."""

    def __init__(self, channels, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(channels))
        self.bias = torch.nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        return self.weight[:, None, None] * (x - mean) / torch.sqrt(var + self.eps) + self.bias[:, None, None]


def _torch_pyramid(layer, dim):
    """ViTDet's SimpleFeaturePyramid in PyTorch (the paper's section 3, detectron2's layout), with
    the Keras layer's weights: one nn.Sequential per scale."""
    from torch import nn

    levels = []
    for scale, keras_layers in zip(layer.scale_factors, layer.levels):
        if scale == 4.0:
            mods = [nn.ConvTranspose2d(dim, dim // 2, 2, 2), _ChannelNorm(dim // 2, layer.epsilon), nn.GELU(),
                    nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2)]
            width = dim // 4
        elif scale == 2.0:
            mods, width = [nn.ConvTranspose2d(dim, dim // 2, 2, 2)], dim // 2
        elif scale == 1.0:
            mods, width = [], dim
        else:
            mods, width = [nn.MaxPool2d(2, 2)], dim
        mods += [nn.Conv2d(width, layer.channels, 1, bias=False), _ChannelNorm(layer.channels, layer.epsilon),
                 nn.Conv2d(layer.channels, layer.channels, 3, padding=1, bias=False),
                 _ChannelNorm(layer.channels, layer.epsilon)]
        weighted = [m for m in mods if list(m.parameters())]
        with torch.no_grad():
            for mod, k in zip(weighted, [k for k in keras_layers if k.weights]):
                w = [keras.ops.convert_to_numpy(v).astype(np.float64) for v in k.weights]
                if isinstance(mod, nn.ConvTranspose2d):  # Keras (kh, kw, out, in) -> torch (in, out, kh, kw)
                    mod.weight.copy_(torch.from_numpy(w[0].transpose(3, 2, 0, 1)))
                    mod.bias.copy_(torch.from_numpy(w[1]))
                elif isinstance(mod, nn.Conv2d):  # (kh, kw, in, out) -> (out, in, kh, kw)
                    mod.weight.copy_(torch.from_numpy(w[0].transpose(3, 2, 0, 1)))
                else:
                    mod.weight.copy_(torch.from_numpy(w[0]))
                    mod.bias.copy_(torch.from_numpy(w[1]))
        levels.append(nn.Sequential(*mods).double())
    return levels


def test_simple_feature_pyramid_equals_vitdet_formula():
    from keras_vit.layers import SimpleFeaturePyramid

    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 4, 6, 16)).astype("float32")
    layer = SimpleFeaturePyramid(channels=8)
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, layer(inputs))
    for v in layer.weights:  # random values everywhere (biases and norms too)
        v.assign(rng.normal(1.0 if v.path.endswith("gamma") else 0.0, 0.3, v.shape).astype("float32"))
    ours = model.predict(x, verbose=0)
    assert [m.shape for m in ours] == [(2, 16, 24, 8), (2, 8, 12, 8), (2, 4, 6, 8), (2, 2, 3, 8)]
    images = torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float64))
    for got, level in zip(ours, _torch_pyramid(layer, 16)):
        with torch.no_grad():
            want = level(images).numpy().transpose(0, 2, 3, 1)
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    with pytest.raises(ValueError, match="scale_factors must be distinct values among"):
        SimpleFeaturePyramid(scale_factors=(8.0,))
    with pytest.raises(ValueError, match="channels 4 divides"):
        SimpleFeaturePyramid(channels=8).build((None, 4, 4, 6))


@pytest.mark.backend_independent
def test_cnn_feature_info_equals_timm():
    """BiT, EfficientNet and the R+ViT hybrid list timm's features: the same channels and
    reductions as timm's `feature_info` of the same architecture."""
    from keras_vit.layers.init_scope import skip_random_init

    for name, arch in [("BiTResNet50x1", "resnetv2_50x1_bit"), ("EfficientNetB0", "tf_efficientnet_b0"),
                       ("RViTTi16", "vit_tiny_r_s16_p8_224")]:
        with skip_random_init():  # shapes only: zero-filled variables build faster
            ours = getattr(keras_vit, name)(weights=None, input_shape=(64, 64, 3)).feature_info
        ref = timm.create_model(arch, pretrained=False, img_size=64) if "vit" in arch else timm.create_model(arch)
        assert [(f["channels"], f["reduction"]) for f in ours] == [
            (f["num_chs"], f["reduction"]) for f in ref.feature_info], name
