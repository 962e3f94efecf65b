"""Masked patch prediction: the paper's self-supervised pilot (BERT-style) for ViT.

50% of the patch embeddings are corrupted (of those: 80% replaced by a learned [mask]
embedding, 10% by the embedding of another random patch of the same image, 10% left
unchanged), and a linear head predicts, from the encoder output at each corrupted position, the
patch's 3-bit mean colour: per channel, the mean over the patch's pixels in [-1, 1] quantised to
3 bits, giving 8**3 = 512 classes. The loss counts only corrupted positions.

    pilot = MaskedPatchPrediction(keras_vit.VisionTransformer(image_size=224, patch_size=16, ...))
    pilot.compile(optimizer=keras_vit.training.pretrain_optimizer(total_steps=...))
    pilot.fit(images_ds, ...)                 # images in [-1, 1]; labels, if any, are ignored
    model = keras_vit.training.for_finetuning(pilot.encoder, image_size=384, classes=1000)

The corruption runs on keras.ops and keras.random (a SeedGenerator held by the model), so it is
part of the compiled train step on JAX, TensorFlow and PyTorch.
"""

import keras
from keras import ops

from keras_vit.backend_workarounds import TraceTrainStepOnce
from keras_vit.models.vit import VisionTransformer
from keras_vit.models.weight_tree import get_weight_tree, set_weight_tree

register = keras.saving.register_keras_serializable(package="keras_vit")

#: Corruption kinds reported by `MaskedPatchPrediction.corrupt`.
KEPT, MASKED, RANDOM_PATCH, UNCHANGED = 0, 1, 2, 3


def colour_targets(images, patch_size, bits=3):
    """The class (0 .. 2**(3*bits) - 1) of each patch's mean colour, (batch, patches) int32.

    Per channel the mean over the patch's pixels (images in [-1, 1]) is quantised to `bits`
    bits, q = clip(floor((mean + 1) / 2 * 2**bits), 0, 2**bits - 1); the class is
    q_r * 2**(2*bits) + q_g * 2**bits + q_b. Patches are row-major over the grid, like tokens.

    Example:
        >>> import numpy as np
        >>> img = np.ones((1, 4, 4, 3), "float32")            # white: every channel at the top bin
        >>> keras.ops.convert_to_numpy(colour_targets(img, 2)).tolist()
        [[511, 511, 511, 511]]
    """
    images = ops.cast(ops.convert_to_tensor(images), "float32")
    height, width, channels = images.shape[1], images.shape[2], images.shape[3]
    if channels != 3:
        raise ValueError(f"colour targets need RGB images (3 channels); got {channels}.")
    if height % patch_size or width % patch_size:
        raise ValueError(f"image size {height}x{width} is not divisible by the patch size {patch_size}.")
    rows, cols = height // patch_size, width // patch_size
    x = ops.reshape(images, (-1, rows, patch_size, cols, patch_size, 3))
    mean = ops.mean(x, axis=(2, 4))
    levels = 2**bits
    q = ops.clip(ops.floor((mean + 1.0) * 0.5 * levels), 0, levels - 1)
    q = ops.cast(q, "int32")
    classes = q[..., 0] * levels * levels + q[..., 1] * levels + q[..., 2]
    return ops.reshape(classes, (-1, rows * cols))


def _encoder_only(encoder):
    """`encoder` as a VisionTransformer that returns tokens (include_top=False, pooling=None)."""
    if not isinstance(encoder, VisionTransformer):
        raise TypeError(f"MaskedPatchPrediction wraps a keras_vit VisionTransformer; got {type(encoder).__name__}.")
    if not encoder.include_top and encoder.pooling is None:
        return encoder
    config = encoder.get_config()
    config.update(include_top=False, pooling=None, representation_size=None)
    config.pop("trainable", None)
    tokens = VisionTransformer(**config)
    set_weight_tree(tokens, get_weight_tree(encoder), skip=("head/", "pre_logits/"))
    return tokens


@register
class MaskedPatchPrediction(TraceTrainStepOnce, keras.Model):
    """A ViT encoder trained to predict the mean colour of corrupted patches.

    Args:
        encoder: a keras_vit VisionTransformer (its head / pooling, if any, are dropped: the
            pilot uses the token sequence). Its weights train in place; afterwards
            `pilot.encoder` (or `pilot.encoder_weight_tree()`) goes to fine-tuning.
        corrupt_rate: fraction of patches corrupted (0.5).
        mask_rate, random_rate: of the corrupted ones, the fraction given the [mask] embedding
            (0.8) and the embedding of another random patch of the same image (0.1); the rest
            (0.1) stay unchanged.
        colour_bits: bits per channel of the colour classes (3 -> 512 classes).
        seed: seed of the corruption's SeedGenerator.

    Call returns {"logits": (batch, patches, 2**(3*bits)), "corrupted": (batch, patches) 0/1}.
    `fit(images)` trains with the masked cross-entropy (no labels needed).

    Example:
        >>> enc = VisionTransformer(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
        ...                         num_heads=2, mlp_dim=32, include_top=False)
        >>> pilot = MaskedPatchPrediction(enc, seed=0)
        >>> pilot.compile(optimizer="adam")
    """

    def __init__(self, encoder, *, corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1, colour_bits=3, seed=None,
                 name="masked_patch_prediction", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(encoder, dict):
            encoder = VisionTransformer.from_config(encoder)
        self.encoder = _encoder_only(encoder)
        if not (0 < corrupt_rate <= 1 and 0 <= mask_rate and 0 <= random_rate and mask_rate + random_rate <= 1):
            raise ValueError(
                f"Need 0 < corrupt_rate <= 1 and mask_rate + random_rate <= 1; got corrupt_rate={corrupt_rate}, "
                f"mask_rate={mask_rate}, random_rate={random_rate}."
            )
        self.corrupt_rate = float(corrupt_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        self.colour_bits = int(colour_bits)
        self.seed = seed
        self.num_colours = 2 ** (3 * self.colour_bits)
        self.seed_generator = keras.random.SeedGenerator(seed, name="corruption_seed")
        layers = [layer for layer in self.encoder.layers if not isinstance(layer, keras.layers.InputLayer)]
        names = [layer.name for layer in layers]
        cut = names.index("embedding")
        self._stem = layers[:cut]
        self._embedding = layers[cut]
        self._encoder_rest = layers[cut + 1 :]
        self.head = keras.layers.Dense(self.num_colours, kernel_initializer="zeros", name="mpp_head")
        height, width = self.encoder.image_size
        self.build((None, height, width, self.encoder.num_channels))

    def build(self, input_shape):
        hidden = self.encoder.hidden_size
        self.mask_embedding = self.add_weight(
            name="mask_embedding", shape=(hidden,), initializer=keras.initializers.RandomNormal(stddev=0.02)
        )
        self.head.build((None, None, hidden))
        self.built = True

    @property
    def num_patches(self):
        rows, cols = self.encoder.grid_size
        return rows * cols

    def corrupt(self, tokens):
        """Corrupt patch embeddings (batch, patches, hidden) -> (tokens, kind (batch, patches)).

        `kind` is KEPT (0), MASKED (1), RANDOM_PATCH (2) or UNCHANGED (3, corrupted but left as
        it was); one uniform draw per position decides it.
        """
        shape = ops.shape(tokens)
        n = tokens.shape[1]
        draw = keras.random.uniform((shape[0], n), seed=self.seed_generator)
        pick = keras.random.uniform((shape[0], n), seed=self.seed_generator)
        r = self.corrupt_rate
        masked = draw < r * self.mask_rate
        random_patch = ops.logical_and(draw >= r * self.mask_rate, draw < r * (self.mask_rate + self.random_rate))
        unchanged = ops.logical_and(draw >= r * (self.mask_rate + self.random_rate), draw < r)
        # Another patch of the same image: a random non-zero offset, so never the patch itself.
        offset = 1 + ops.minimum(ops.cast(ops.floor(pick * (n - 1)), "int32"), n - 2) if n > 1 else 0
        index = ops.mod(ops.arange(n, dtype="int32")[None, :] + offset, n)
        index = ops.broadcast_to(ops.expand_dims(index, -1), shape)
        other = ops.take_along_axis(tokens, index, axis=1)
        mask_embedding = ops.cast(self.mask_embedding, tokens.dtype)
        out = ops.where(ops.expand_dims(random_patch, -1), other, tokens)
        out = ops.where(ops.expand_dims(masked, -1), mask_embedding, out)
        kind = (
            ops.cast(masked, "int32") * MASKED
            + ops.cast(random_patch, "int32") * RANDOM_PATCH
            + ops.cast(unchanged, "int32") * UNCHANGED
        )
        return out, kind

    def call(self, images, training=None):
        x = images
        for layer in self._stem:
            x = layer(x, training=training)
        x = self._embedding(x)
        x, kind = self.corrupt(x)
        for layer in self._encoder_rest:
            x = layer(x, training=training)
        patches = x[:, self.encoder.num_prefix_tokens :]
        logits = ops.cast(self.head(patches), "float32")
        return {"logits": logits, "corrupted": ops.cast(kind > 0, "float32")}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        images = x[0] if isinstance(x, (tuple, list)) else x
        if isinstance(images, dict):
            images = images.get("image", images.get("images"))
        targets = colour_targets(images, self.encoder.stride, self.colour_bits)
        logits, weight = y_pred["logits"], y_pred["corrupted"]
        per_patch = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
        loss = ops.sum(per_patch * weight) / ops.maximum(ops.sum(weight), 1.0)
        if self.losses:
            loss = loss + ops.sum(self.losses)
        return loss

    def encoder_weight_tree(self):
        """The encoder's weights as the canonical tree (no head), for `set_weight_tree`."""
        return get_weight_tree(self.encoder)

    def get_config(self):
        return {
            "encoder": self.encoder.get_config(),
            "corrupt_rate": self.corrupt_rate,
            "mask_rate": self.mask_rate,
            "random_rate": self.random_rate,
            "colour_bits": self.colour_bits,
            "seed": self.seed,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        encoder = VisionTransformer.from_config(config.pop("encoder"))
        return cls(encoder, **config)
