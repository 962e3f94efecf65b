"""Position-embedding resize rules against the libraries that define them.

"original" is scipy.ndimage.zoom(order=1) as google-research/vision_transformer calls it;
"bicubic_antialias" is timm.layers.resample_abs_pos_embed (timm's loader for other sizes);
"bilinear" is what timm's .npz loader (`_load_weights`) passes to the same function
(interpolation='bilinear', antialias=False); "bicubic" is transformers' interpolate_pos_encoding,
torch.nn.functional.interpolate(mode="bicubic", align_corners=False).
"""

import sys

import numpy as np
import pytest
import scipy.ndimage

from keras_vit.layers.resize import interpolation_matrix, resize_position_embedding

# NumPy resize rules against SciPy, timm and PyTorch: no Keras backend takes part.
pytestmark = pytest.mark.backend_independent

# TensorFlow and triton's bundled LLVM clash in one process (a segfault when triton loads after
# TensorFlow); the torch references here run on CPU and never need triton.
sys.modules.setdefault("triton", None)

# (source grid, target grid): up, down, non-square both ways, 1-wide edges.
GRIDS = [((7, 7), (12, 12)), ((12, 12), (7, 7)), ((4, 6), (9, 5)), ((9, 5), (4, 6)), ((3, 3), (3, 8)), ((5, 2), (1, 4))]


def _pe(grid, prefix, dim=5, seed=0):
    return np.random.default_rng(seed).standard_normal((1, prefix + grid[0] * grid[1], dim)).astype("float32")


def _torch_reference(pe, src, dst, prefix, **interp):
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(pe[:, prefix:].astype("float64")).reshape(1, src[0], src[1], -1).permute(0, 3, 1, 2)
    out = F.interpolate(t, size=dst, **interp).permute(0, 2, 3, 1).reshape(1, -1, pe.shape[-1]).numpy()
    return np.concatenate([pe[:, :prefix], out], axis=1)


def _cases(grids=GRIDS, prefixes=(1, 0)):
    # Looped inside one test each: the suite's per-test set-up costs more than the arithmetic.
    return [(src, dst, prefix) for src, dst in grids for prefix in prefixes]


def test_original_rule_is_scipy_zoom_order_1():
    for src, dst, prefix in _cases():
        _check_original(src, dst, prefix)


def _check_original(src, dst, prefix):
    pe = _pe(src, prefix)
    grid = pe[0, prefix:].reshape(src[0], src[1], -1).astype("float64")
    zoom = (dst[0] / src[0], dst[1] / src[1], 1)
    ref = scipy.ndimage.zoom(grid, zoom, order=1)
    assert ref.shape[:2] == dst
    ref = np.concatenate([pe[:, :prefix], ref.reshape(1, -1, pe.shape[-1])], axis=1)
    out = resize_position_embedding(pe, dst, num_prefix_tokens=prefix, source_grid=src, rule="original")
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rule,seed", [("bicubic", 1), ("bilinear", 2)])
def test_half_pixel_rules_are_torch_interpolate(rule, seed):
    for src, dst in GRIDS:
        pe = _pe(src, 1, seed=seed)
        ref = _torch_reference(pe, src, dst, 1, mode=rule, align_corners=False)
        out = resize_position_embedding(pe, dst, source_grid=src, rule=rule)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)


def test_timm_rule_is_resample_abs_pos_embed():
    import torch
    from timm.layers import resample_abs_pos_embed

    for src, dst, prefix in _cases():
        pe = _pe(src, prefix, seed=3)
        ref = resample_abs_pos_embed(
            torch.from_numpy(pe), new_size=list(dst), old_size=list(src), num_prefix_tokens=prefix
        ).numpy()
        out = resize_position_embedding(pe, dst, num_prefix_tokens=prefix, source_grid=src, rule="bicubic_antialias")
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)


def test_timm_npz_loader_rule_is_bilinear_without_antialias():
    import torch
    from timm.layers import resample_abs_pos_embed

    for src, dst in GRIDS:
        pe = _pe(src, 1, seed=4)
        ref = resample_abs_pos_embed(
            torch.from_numpy(pe), new_size=list(dst), old_size=list(src), num_prefix_tokens=1,
            interpolation="bilinear", antialias=False,
        ).numpy()
        out = resize_position_embedding(pe, dst, source_grid=src, rule="bilinear")
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6)


@pytest.mark.parametrize("rule", ["original", "bilinear", "bicubic", "bicubic_antialias"])
def test_rows_sum_to_one_and_identity_at_same_size(rule):
    for n_in, n_out in [(7, 12), (12, 7), (1, 4), (4, 1), (5, 5)]:
        m = interpolation_matrix(n_in, n_out, rule)
        np.testing.assert_allclose(m.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(interpolation_matrix(6, 6, rule), np.eye(6), atol=1e-12)
    pe = _pe((4, 6), 1)
    np.testing.assert_array_equal(resize_position_embedding(pe, (4, 6), source_grid=(4, 6), rule=rule), pe)


def test_errors_name_the_problem():
    pe = _pe((4, 6), 1)
    with pytest.raises(ValueError, match="not a square"):
        resize_position_embedding(pe, (5, 5))
    with pytest.raises(ValueError, match="does not match the source grid"):
        resize_position_embedding(pe, (5, 5), source_grid=(5, 5))
    with pytest.raises(ValueError, match="Unknown position-embedding resize rule"):
        resize_position_embedding(pe, (5, 5), source_grid=(4, 6), rule="nearest")
    # 2-D input keeps its rank.
    assert resize_position_embedding(pe[0], (2, 3), source_grid=(4, 6)).shape == (7, 5)
