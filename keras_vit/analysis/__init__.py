"""Inspecting a Vision Transformer (the paper's §4.5): attention, rollout, attention distance,
position-embedding similarity and patch-embedding components, on any keras_vit model.

Array maths lives in `keras_vit.analysis.maths` (pure NumPy); plots in `.plots` import
matplotlib only when called (Agg, no pyplot state).

    from keras_vit import analysis
    att = analysis.attention_weights(model, images)       # (layers, batch, heads, T, T)
    maps = analysis.attention_rollout(model, images)      # (batch, rows, cols)
    dist = analysis.attention_distance(model, images)     # (layers, heads), input pixels
    analysis.plot_attention_distance(dist, "distance.png")
    analysis.save_png("rollout.png", analysis.overlay_attention(images[0], maps[0]))

The same from the shell: `keras-vit explain IMAGE... --weights W --out DIR`.
"""

from keras_vit.analysis.attention import (  # noqa: F401
    anatomy,
    attention_distance,
    attention_model,
    attention_rollout,
    attention_weights,
)
from keras_vit.analysis.maths import (  # noqa: F401
    mean_attention_distance,
    patch_centres,
    principal_components,
    rollout,
    rollout_map,
)
from keras_vit.analysis.embeddings import patch_embedding_components, position_embedding_similarity  # noqa: F401
from keras_vit.analysis.plots import (  # noqa: F401
    overlay_attention,
    plot_attention_distance,
    plot_patch_embedding_components,
    plot_position_embedding_similarity,
    plot_rollout,
    save_png,
)
