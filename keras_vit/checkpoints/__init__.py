"""Checkpoint formats: every upstream format <-> the canonical weight tree, one module per
format, listed in a registry (keras_vit.checkpoints.registry).

    tree, config = read_checkpoint("vit_base_patch16_224/")   # timm, transformers, .npz, Keras
    write_npz(tree, "ViT-B_16.npz")                            # back to the original layout
    save_preset(model, "vit_b16_preset/")                      # a Keras preset folder

Loading into a model (one build, weights streamed from the file) is keras_vit.load_checkpoint.
"""

from keras_vit.checkpoints.big_vision import read_big_vision, write_big_vision_npz
from keras_vit.checkpoints.bit import read_bit_npz, read_timm_bit, write_bit_npz
from keras_vit.checkpoints.keras_format import save_preset
from keras_vit.checkpoints.npz import read_npz, write_npz
from keras_vit.checkpoints.registry import CheckpointFormat, detect_format, formats, get_format, read_checkpoint
from keras_vit.checkpoints.timm import read_timm
from keras_vit.checkpoints.transformers import read_transformers
from keras_vit.errors import CheckpointError
