"""Pictures of the analysis: rollout overlays and the paper's Figure 7 and Figure 10 plots.

matplotlib is imported inside the functions (never at package import) and used through
`matplotlib.figure.Figure` only: no pyplot, no global backend state, PNGs rendered with Agg.
Every `plot_*` function returns the Figure and, given `path`, writes it as PNG.
"""

import numpy as np


def _figure(**kwargs):
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _finish(fig, path, dpi=100):
    if path is not None:
        fig.savefig(path, format="png", dpi=dpi, bbox_inches="tight")
    return fig


def to_uint8_rgb(image):
    """An image as (H, W, 3) uint8: uint8 stays; floats with negative values are taken as
    [-1, 1] (keras_vit's input range), floats within [0, 1] as [0, 1], other floats as [0, 255].
    One channel is repeated to three."""
    x = np.asarray(image)
    if x.ndim == 2:
        x = x[..., None]
    if x.ndim != 3:
        raise ValueError(f"Expected one image (height, width, channels); got shape {x.shape}.")
    if x.dtype != np.uint8:
        x = x.astype(np.float64)
        if x.min() < 0:
            x = (x + 1.0) * 127.5
        elif x.max() <= 1.0:
            x = x * 255.0
        x = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return x[..., :3]


def _resize(array, size, resample):
    from PIL import Image

    height, width = size
    return np.asarray(Image.fromarray(np.asarray(array, dtype=np.float32)).resize((width, height), resample))


def overlay_attention(image, attention_map, alpha=0.5, cmap="jet"):
    """`attention_map` (rows, cols) blended over `image` as an (H, W, 3) uint8 RGB array.

    The map is rescaled to [0, 1] (min to max), upsampled bilinearly to the image size and
    coloured with `cmap`; `alpha` is the weight of the colour layer.

    Example:
        >>> rgb = overlay_attention(image, attention_rollout(model, image[None])[0])
        >>> save_png("rollout.png", rgb)
    """
    import matplotlib

    rgb = to_uint8_rgb(image).astype(np.float64)
    m = np.asarray(attention_map, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"attention_map must be (rows, cols); got shape {m.shape}.")
    span = m.max() - m.min()
    m = (m - m.min()) / span if span > 0 else np.zeros_like(m)
    from PIL import Image

    m = np.clip(_resize(m, rgb.shape[:2], Image.BILINEAR), 0.0, 1.0)
    colour = matplotlib.colormaps[cmap](m)[..., :3] * 255.0
    out = (1.0 - alpha) * rgb + alpha * colour
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def save_png(path, image):
    """Write an image (anything `to_uint8_rgb` takes) to `path` as PNG."""
    from PIL import Image

    Image.fromarray(to_uint8_rgb(image)).save(path, format="PNG")
    return path


def plot_rollout(image, attention_map, path=None, title=None, alpha=0.5):
    """Image, rollout map and overlay side by side."""
    rgb = to_uint8_rgb(image)
    fig = _figure(figsize=(9, 3.3))
    axes = fig.subplots(1, 3)
    axes[0].imshow(rgb)
    axes[0].set_title("input")
    im = axes[1].imshow(np.asarray(attention_map), cmap="viridis")
    axes[1].set_title("attention rollout")
    fig.colorbar(im, ax=axes[1], fraction=0.046, pad=0.04)
    axes[2].imshow(overlay_attention(rgb, attention_map, alpha=alpha))
    axes[2].set_title("overlay")
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title)
    return _finish(fig, path)


def plot_attention_distance(distances, path=None, title="Mean attention distance", image_size=None):
    """The paper's Figure 7 (right): one dot per head, network depth (layer) on x, mean
    attention distance in pixels on y. `distances` is (layers, heads) from
    `mean_attention_distance` / `attention_distance`."""
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"distances must be (layers, heads); got shape {d.shape}.")
    layers, heads = d.shape
    fig = _figure(figsize=(5, 4))
    ax = fig.subplots()
    colours = _colours(heads)
    for h in range(heads):
        ax.scatter(np.arange(1, layers + 1), d[:, h], s=14, color=colours[h], label=f"head {h + 1}")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xlim(0.5, layers + 0.5)
    top = max(float(d.max()) * 1.1, 1.0)
    if image_size is not None:
        top = max(top, float(np.hypot(*image_size)) / 2)
    ax.set_ylim(0, top)
    ax.set_xticks(range(1, layers + 1, max(1, layers // 12)))
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right", frameon=False)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def _colours(n):
    import matplotlib

    cmap = matplotlib.colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def similarity_mosaic(similarity, gap=1, fill=np.nan):
    """(rows, cols, rows, cols) similarities tiled into one (rows*(rows+gap), cols*(cols+gap))
    image: tile (i, j) is patch (i, j)'s similarity map, tiles separated by `gap` NaN pixels."""
    s = np.asarray(similarity, dtype=np.float64)
    rows, cols = s.shape[:2]
    th, tw = s.shape[2] + gap, s.shape[3] + gap
    mosaic = np.full((rows * th - gap, cols * tw - gap), fill)
    for i in range(rows):
        for j in range(cols):
            mosaic[i * th : i * th + s.shape[2], j * tw : j * tw + s.shape[3]] = s[i, j]
    return mosaic


def plot_position_embedding_similarity(similarity, path=None, title="Position embedding similarity"):
    """The paper's Figure 10: for every input patch (row, column), the cosine similarity of its
    position embedding with those of all other patches, as a grid of small maps."""
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 4:
        raise ValueError(f"similarity must be (rows, cols, rows, cols); got shape {s.shape}.")
    rows, cols = s.shape[:2]
    mosaic = similarity_mosaic(s)
    fig = _figure(figsize=(6.4, 6.4 * rows / cols + 0.4))
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(mosaic), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_facecolor("white")
    step_r, step_c = s.shape[2] + 1, s.shape[3] + 1
    tick = max(1, rows // 7)
    ax.set_yticks([i * step_r + (s.shape[2] - 1) / 2 for i in range(0, rows, tick)])
    ax.set_yticklabels([str(i + 1) for i in range(0, rows, tick)])
    tick = max(1, cols // 7)
    ax.set_xticks([j * step_c + (s.shape[3] - 1) / 2 for j in range(0, cols, tick)])
    ax.set_xticklabels([str(j + 1) for j in range(0, cols, tick)])
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Cosine similarity")
    ax.set_title(title)
    return _finish(fig, path)


def rescale_unit(x):
    """Rescale an array to [0, 1] (min to max); a constant array becomes 0.5."""
    x = np.asarray(x, dtype=np.float64)
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.full_like(x, 0.5)


def plot_patch_embedding_components(components, path=None, columns=7, title=None):
    """The paper's Figure 7 (left): principal components of the patch-embedding filters, each
    rescaled to [0, 1] on its own for display (RGB for 3 channels, grey otherwise)."""
    c = np.asarray(components, dtype=np.float64)
    if c.ndim != 4:
        raise ValueError(f"components must be (n, p, p, channels); got shape {c.shape}.")
    if title is None:
        kind = "RGB embedding filters" if c.shape[-1] == 3 else "Embedding filters"
        title = f"{kind} (first {c.shape[0]} principal components)"
    n = c.shape[0]
    columns = max(1, min(columns, n))
    rows = -(-n // columns)
    fig = _figure(figsize=(columns * 1.0, rows * 1.0 + 0.5))
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
    for k, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if k >= n:
            ax.axis("off")
            continue
        img = rescale_unit(c[k])
        if img.shape[-1] == 3:
            ax.imshow(img, interpolation="nearest")
        else:
            ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    fig.suptitle(title, fontsize=9)
    return _finish(fig, path)
