"""AxialResNet against a PyTorch reference written here from csrhddlam/axial-deeplab's
`lib/models/axialnet.py` (its modules, key names and arithmetic, NCHW, the original's operation
order): parameter counts of the four constructors, and logits through the original's checkpoint
files (`torch.save` of `{"epoch", "state_dict": {"module.…"}, "optimizer"}` as its training script
writes, and a bare state dict) on random weights and BatchNorm statistics.
"""

import math
import sys

import keras
import numpy as np
import pytest
from conftest import randomize_torch_batch_norm, rel_err

import keras_vit
from keras_vit import CheckpointError

sys.modules.setdefault("triton", None)  # see test_checkpoints: triton's LLVM and TensorFlow clash
torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


# === The reference: the original's modules, re-typed from its structure ===


class RefAxialAttention(nn.Module):
    def __init__(self, in_planes, out_planes, groups, kernel_size, stride=1, width=False):
        super().__init__()
        self.groups, self.out_planes, self.kernel_size = groups, out_planes, kernel_size
        self.group_planes = out_planes // groups
        self.stride, self.width = stride, width
        self.qkv_transform = nn.Conv1d(in_planes, out_planes * 2, kernel_size=1, bias=False)
        self.bn_qkv = nn.BatchNorm1d(out_planes * 2)
        self.bn_similarity = nn.BatchNorm2d(groups * 3)
        self.bn_output = nn.BatchNorm1d(out_planes * 2)
        self.relative = nn.Parameter(torch.randn(self.group_planes * 2, kernel_size * 2 - 1))
        q_index = torch.arange(kernel_size).unsqueeze(0)
        k_index = torch.arange(kernel_size).unsqueeze(1)
        self.register_buffer("flatten_index", (k_index - q_index + kernel_size - 1).view(-1))
        if stride > 1:
            self.pooling = nn.AvgPool2d(stride, stride=stride)

    def forward(self, x):
        x = x.permute(0, 2, 1, 3) if self.width else x.permute(0, 3, 1, 2)
        n, w, c, h = x.shape
        x = x.contiguous().view(n * w, c, h)
        gp = self.group_planes
        qkv = self.bn_qkv(self.qkv_transform(x))
        q, k, v = torch.split(qkv.reshape(n * w, self.groups, gp * 2, h), [gp // 2, gp // 2, gp], dim=2)
        emb = torch.index_select(self.relative, 1, self.flatten_index).view(gp * 2, self.kernel_size, self.kernel_size)
        q_emb, k_emb, v_emb = torch.split(emb, [gp // 2, gp // 2, gp], dim=0)
        qr = torch.einsum("bgci,cij->bgij", q, q_emb)
        kr = torch.einsum("bgci,cij->bgij", k, k_emb).transpose(2, 3)
        qk = torch.einsum("bgci,bgcj->bgij", q, k)
        sim = self.bn_similarity(torch.cat([qk, qr, kr], dim=1)).view(n * w, 3, self.groups, h, h).sum(dim=1)
        sim = F.softmax(sim, dim=3)
        sv = torch.einsum("bgij,bgcj->bgci", sim, v)
        sve = torch.einsum("bgij,cij->bgci", sim, v_emb)
        out = torch.cat([sv, sve], dim=-1).view(n * w, self.out_planes * 2, h)
        out = self.bn_output(out).view(n, w, self.out_planes, 2, h).sum(dim=-2)
        out = out.permute(0, 2, 1, 3) if self.width else out.permute(0, 2, 3, 1)
        return self.pooling(out) if self.stride > 1 else out


class RefAxialBlock(nn.Module):
    expansion = 2

    def __init__(self, inplanes, planes, stride, downsample, groups, kernel_size):
        super().__init__()
        self.conv_down = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.hight_block = RefAxialAttention(planes, planes, groups, kernel_size)
        self.width_block = RefAxialAttention(planes, planes, groups, kernel_size, stride=stride, width=True)
        self.conv_up = nn.Conv2d(planes, planes * 2, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes * 2)
        self.downsample = downsample

    def forward(self, x):
        out = F.relu(self.bn1(self.conv_down(x)))
        out = F.relu(self.width_block(self.hight_block(out)))
        out = self.bn2(self.conv_up(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return F.relu(out + identity)


class RefAxialNet(nn.Module):
    """AxialAttentionNet; `kernel_sizes` are the stages' first spans (the original's 56, 56, 28, 14)."""

    def __init__(self, layers, s, kernel_sizes=(56, 56, 28, 14), num_classes=1000, groups=8):
        super().__init__()
        self.inplanes = int(64 * s)
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for i, (n, k) in enumerate(zip(layers, kernel_sizes)):
            setattr(self, f"layer{i + 1}", self._make_layer(int(128 * 2**i * s), n, k, 1 if i == 0 else 2, groups))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self.inplanes, num_classes)
        self.num_stages = len(layers)

    def _make_layer(self, planes, blocks, kernel_size, stride, groups):
        downsample = None
        if stride != 1 or self.inplanes != planes * 2:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 2, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 2))
        layers = [RefAxialBlock(self.inplanes, planes, stride, downsample, groups, kernel_size)]
        self.inplanes = planes * 2
        if stride != 1:
            kernel_size //= 2
        layers += [RefAxialBlock(self.inplanes, planes, 1, None, groups, kernel_size) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


# === Parameter counts ===

#: The original's constructors: (layers, s).
ORIGINAL = {"AxialResNet26S": ((1, 2, 4, 1), 0.5), "AxialResNet50S": ((3, 4, 6, 3), 0.5),
            "AxialResNet50M": ((3, 4, 6, 3), 0.75), "AxialResNet50L": ((3, 4, 6, 3), 1.0)}


def _trainable_count(model):
    return sum(math.prod(v.shape) for v in model.trainable_weights)


@pytest.mark.backend_independent  # shapes only
@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_parameter_counts_equal_the_original(name):
    layers, s = ORIGINAL[name]
    with torch.device("meta"):  # shapes only
        reference = RefAxialNet(layers, s)
    expected = sum(p.numel() for p in reference.parameters())
    with keras.StatelessScope():  # no variable initialised
        model = getattr(keras_vit, name)(weights=None)
    assert _trainable_count(model) == expected
    assert model.output_shape == (None, 1000)
    # BatchNorm running statistics are the model's non-trainable weights, as the original's buffers
    running = sum(b.numel() for n, b in reference.named_buffers() if n.endswith(("running_mean", "running_var")))
    assert sum(math.prod(v.shape) for v in model.non_trainable_weights) == running


# === Logits through the original's checkpoint files ===

#: A reduced network through the same code: 32 px (an 8x8 stem grid; spans 8, 8/4, 4/2, 2/1),
#: s = 0.25 (2-channel queries and keys per head), one block per stage but two in the second (a
#: block after a strided one, whose span is halved).
SMALL = dict(layers=(1, 2, 1, 1), s=0.25, kernel_sizes=(8, 8, 4, 2), num_classes=10)


def images(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


def torch_logits(module, x):
    with torch.no_grad():
        return module(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()


@pytest.fixture(scope="module")
def small_reference():
    torch.manual_seed(0)
    return randomize_torch_batch_norm(RefAxialNet(**SMALL), seed=3)


def test_logits_equal_the_original_through_its_training_checkpoint(tmp_path, small_reference):
    ref = small_reference
    # dist_train.py: a DistributedDataParallel model's state dict ("module." keys) beside the
    # epoch and the optimizer state.
    state = {f"module.{k}": v for k, v in ref.state_dict().items()}
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    torch.save({"epoch": 90, "state_dict": state, "optimizer": optimizer.state_dict()}, tmp_path / "model.pth.tar")
    model = keras_vit.load_checkpoint(tmp_path / "model.pth.tar", classifier_activation=None)
    config = model.get_config()
    assert config["image_size"] == [32, 32] and config["block_units"] == [1, 2, 1, 1]
    assert config["width_multiplier"] == 0.25 and config["groups"] == 8 and config["classes"] == 10
    assert keras_vit.family_of(model).name == "axial_resnet"
    x = images((2, 32, 32, 3))
    expected = torch_logits(ref, x)
    err = rel_err(model.predict(x, verbose=0), expected)
    print(f"AxialResNet logits vs the reference: relative error {err:.2e}")
    assert err < 4e-6, err  # measured 3.7e-7 (JAX), 4.4e-7 (TensorFlow, PyTorch)

    # A .keras round trip keeps the weights and the BatchNorm statistics (safe mode, no custom objects).
    model.save(tmp_path / "axial.keras")
    reloaded = keras.saving.load_model(tmp_path / "axial.keras")
    assert type(reloaded) is type(model) and reloaded.get_config() == model.get_config()
    assert rel_err(reloaded.predict(x, verbose=0), expected) < 4e-6
    # ... and through keras_vit's own loader (the family's checkpoint config, one build).
    again = keras_vit.load_checkpoint(tmp_path / "axial.keras", classifier_activation=None)
    assert rel_err(again.predict(x, verbose=0), expected) < 4e-6


@pytest.mark.backend_independent  # the reader only
def test_bare_state_dict_reads_the_same(tmp_path, small_reference):
    from keras_vit.checkpoints.axial_deeplab import read_axial_deeplab

    torch.save(small_reference.state_dict(), tmp_path / "axial.pth")
    state = {f"module.{k}": v for k, v in small_reference.state_dict().items()}
    torch.save({"epoch": 1, "state_dict": state}, tmp_path / "model.pth.tar")
    bare, bare_config = read_axial_deeplab(tmp_path / "axial.pth")
    wrapped, wrapped_config = read_axial_deeplab(tmp_path / "model.pth.tar")
    assert bare_config == wrapped_config and sorted(bare) == sorted(wrapped)
    for key in bare:
        np.testing.assert_array_equal(bare[key], wrapped[key])
    # Layouts: PyTorch (out, in, kh, kw) -> (kh, kw, in, out); Conv1d (2c, in, 1) -> (in, 2c).
    ref = small_reference
    np.testing.assert_array_equal(bare["conv1/kernel"], ref.conv1.weight.detach().numpy().transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(bare["layer2/1/width_block/qkv_transform/kernel"],
                                  ref.layer2[1].width_block.qkv_transform.weight.detach().numpy()[:, :, 0].T)
    np.testing.assert_array_equal(bare["layer3/0/downsample/1/moving_variance"],
                                  ref.layer3[0].downsample[1].running_var.numpy())
    assert bare["layer2/1/hight_block/relative"].shape == (2 * 8, 2 * 4 - 1)  # span halved after the stride


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_flops_equal_torch_flop_counter(name):
    """Table-6 convention (one multiply-add = 2; norms, softmax and pools not counted), against
    PyTorch's own FLOP counter on the reference at 224 px (shapes only, nothing computed)."""
    from torch.utils.flop_counter import FlopCounterMode

    layers, s = ORIGINAL[name]
    with torch.device("meta"):
        reference = RefAxialNet(layers, s).eval()
        with FlopCounterMode(display=False) as counter:
            reference(torch.empty(1, 3, 224, 224))
    assert keras_vit.flops(name, image_size=224) == counter.get_total_flops()


# === Input sizes ===


@pytest.mark.backend_independent
def test_spans_follow_the_image_size_and_impossible_sizes_are_refused():
    from keras_vit.models.axial_resnet_family import axial_spans

    spans = axial_spans(224, (3, 4, 6, 3))  # the original's kernel sizes, block by block
    assert [s for s, _ in spans] == [56] * 3 + [56] + [28] * 3 + [28] + [14] * 5 + [14] + [7] * 2
    assert [st for _, st in spans] == [1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1]
    assert axial_spans(221, (3, 4, 6, 3)) == spans  # 221-223 px reach the same 56x56 grid
    assert axial_spans(256, (1, 2, 4, 1))[0] == (64, 1)
    with pytest.raises(ValueError, match=r"square image.*224x192"):
        axial_spans((224, 192), (3, 4, 6, 3))
    with pytest.raises(ValueError, match=r"25x25 grid must halve evenly 3 times.*multiple of 32, e\.g\. image_size=96"):
        axial_spans(100, (3, 4, 6, 3))
    with pytest.raises(ValueError, match="fixed image size"):
        axial_spans((None, None), (3, 4, 6, 3))
    with pytest.raises(ValueError, match="square image"):
        keras_vit.AxialResNet50S(weights=None, input_shape=(224, 160, 3))
    with pytest.raises(ValueError, match="built for one input size"):
        keras_vit.AxialResNet26S(weights=None, input_shape=(None, None, 3))


def test_checkpoint_refuses_another_image_size(tmp_path, small_reference):
    torch.save(small_reference.state_dict(), tmp_path / "axial.pth")
    with pytest.raises(CheckpointError, match=r"trained at 32x32 px .*cannot run at image_size=64"):
        keras_vit.load_checkpoint(tmp_path / "axial.pth", image_size=64)
    # A constructor takes the original's files too, and checks that they hold its architecture.
    with pytest.raises(ValueError, match=r"different architecture \(AxialResNet, blocks \(1, 2, 1, 1\), width x0.25"):
        keras_vit.AxialResNet26S(weights=str(tmp_path / "axial.pth"), input_shape=(32, 32, 3))
    # At the constructor's default size (224) the spans do not fit either; the architecture is what to fix.
    with pytest.raises(ValueError, match=r"different architecture \(AxialResNet, blocks \(1, 2, 1, 1\).* than "
                                         r"AxialResNet26S"):
        keras_vit.AxialResNet26S(weights=str(tmp_path / "axial.pth"))


# === Damaged and foreign checkpoints ===


def _axial_file(tmp_path, name, edit=None):
    """A small axial-deeplab .pth.tar written without torch (tests/torch_zip_files.py), its state
    dict changed by `edit(state)`; returns its path."""
    from torch_zip_files import axial_deeplab_sample, axial_deeplab_state, state_dict_bytes

    _, tree = axial_deeplab_sample()
    state = axial_deeplab_state(tree)
    if edit is not None:
        edit(state)
    path = tmp_path / name
    path.write_bytes(state_dict_bytes(state, wrap="state_dict", prefix="module."))
    return path


@pytest.mark.backend_independent
def test_damaged_checkpoints_name_the_file_and_the_weight(tmp_path):
    """Missing, unexpected, mis-shaped, integer and non-finite weights: one CheckpointError that
    names the file and the weight by its key in the state dict."""
    cases = [
        ("missing.pth.tar", lambda s: s.pop("layer1.0.bn1.weight"),
         r"missing.pth.tar: The checkpoint does not fit the model: missing weights: layer1/0/bn1/gamma\."),
        ("extra.pth.tar", lambda s: s.update({"layer1.0.extra.bias": np.zeros(4, np.float32)}),
         r"extra.pth.tar: The checkpoint does not fit the model: unexpected weights: layer1/0/extra/bias\."),
        ("shape.pth.tar", lambda s: s.update({"layer1.0.bn1.weight": np.ones(5, np.float32)}),
         r"shape.pth.tar: .*shape mismatch for layer1/0/bn1/gamma: checkpoint \(5,\) vs model \(32,\)"),
        ("int.pth.tar", lambda s: s.update({"layer1.0.bn1.weight": np.arange(32)}),
         r"int.pth.tar: weight 'layer1.0.bn1.weight' has dtype Long; AxialResNet's weights are floating point"),
        ("nan.pth.tar", lambda s: s["fc.weight"].__setitem__((0, 0), np.nan),
         r"nan.pth.tar: weight 'module.fc.weight' holds 1 non-finite value\(s\).*Delete it and download"),
    ]
    for name, edit, message in cases:
        path = _axial_file(tmp_path, name, edit)
        with pytest.raises(CheckpointError, match=message):
            keras_vit.load_checkpoint(path)
    # Recognised by its content under any name; under another format's name, refused as such.
    from keras_vit.checkpoints import detect_format

    assert detect_format(_axial_file(tmp_path, "model_best")).name == "axial_deeplab"
    with pytest.raises(CheckpointError, match=r"model.npz' is named like a NumPy .npz archive but holds a PyTorch zip "
                                              r"file \(torch.save\).*ending in '.pth.tar'"):
        keras_vit.load_checkpoint(_axial_file(tmp_path, "model.npz"))


def test_a_failed_load_into_a_built_model_changes_no_weight(tmp_path):
    """A lazily read tree whose last tensor (the classifier's) holds a NaN, assigned to a built
    AxialResNet: refused naming that tensor, and every weight, including those read before it,
    is as it was."""
    from keras_vit.checkpoints.axial_deeplab import read_axial_deeplab

    path = _axial_file(tmp_path, "nan.pth.tar", lambda s: s["fc.weight"].__setitem__((2, 5), np.inf))
    tree, config = read_axial_deeplab(path, lazy=True)
    model = keras_vit.models.AxialResNet(**config)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(size=variable.shape).astype(variable.dtype))
    before = keras_vit.get_weight_tree(model)
    with pytest.raises(CheckpointError, match=r"weight 'module.fc.weight' holds 1 non-finite"):
        keras_vit.set_weight_tree(model, tree)
    after = keras_vit.get_weight_tree(model)
    assert [k for k in before if not np.array_equal(before[k], after[k])] == []


@pytest.mark.backend_independent  # refused before a model is built
def test_checkpoints_of_other_families_name_the_architecture(tmp_path):
    """An EfficientNet file given to an AxialResNet constructor and an AxialResNet file given to
    constructors of other families (at their default sizes, where its spans do not fit either)
    name both architectures."""
    from test_hostile_files import timm_efficientnet_sample

    efficientnet = tmp_path / "efficientnet.safetensors"
    efficientnet.write_bytes(timm_efficientnet_sample()[0])
    with pytest.raises(ValueError, match=r"different architecture \(EfficientNet, width x0.25, depth x0.3\) than "
                                         r"AxialResNet50S"):
        keras_vit.AxialResNet50S(weights=str(efficientnet))
    axial = _axial_file(tmp_path, "model.pth.tar")
    for constructor, name in [(keras_vit.EfficientNetB3, "EfficientNetB3"), (keras_vit.ViTB16, "ViTB16"),
                              (keras_vit.BiTResNet50x1, "BiTResNet50x1")]:
        with pytest.raises(ValueError, match=rf"different architecture \(AxialResNet, blocks \(1, 1, 1, 1\), width "
                                             rf"x0.25, 8 heads\) than {name}"):
            constructor(weights=str(axial))
