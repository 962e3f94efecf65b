"""Checkpoint readers and writers: every upstream format <-> the canonical weight tree.

    tree, config = read_checkpoint("vit_base_patch16_224/")   # timm, transformers, .npz, Keras
    model = build_model(tree, config, image_size=384)
    write_npz(tree, "ViT-B_16.npz")                            # back to the original layout
    save_preset(model, "vit_b16_preset/")                      # a Keras preset folder
"""

from keras_vit.checkpoints.bit import read_bit_npz, read_timm_bit, write_bit_npz
from keras_vit.checkpoints.common import CheckpointError
from keras_vit.checkpoints.keras_format import save_preset
from keras_vit.checkpoints.loader import FORMATS, build_model, detect_format, load_checkpoint, read_checkpoint
from keras_vit.checkpoints.npz import read_npz, write_npz
from keras_vit.checkpoints.timm import read_timm
from keras_vit.checkpoints.transformers import read_transformers
