"""What transfer means for one model family: how a pretrained model is re-made for fine-tuning
(`keras_vit.training.for_finetuning`, `keras-vit finetune`, `keras-vit vtab`) and which of its
outputs are its features (`keras_vit.training.extract_features`, `keras-vit fewshot`).

Every family record holds one `Transfer` (`ModelFamily.transfer`); the shared code asks it and
never which family a model is. Whatever the family, the fine-tuned model gets a fresh
zero-initialised head (the paper's recipe and BiT-HyperRule's). No Keras here.
"""

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from keras_vit.geometry import optional_pair


def _resolve(reference):
    if isinstance(reference, str) and ":" in reference:
        module, attribute = reference.split(":", 1)
        return getattr(importlib.import_module(module), attribute)
    return reference


@dataclasses.dataclass(frozen=True)
class Transfer:
    """What fine-tuning and few-shot evaluation of a pretrained model of one family mean.

    Attributes:
        settings: the model arguments the fine-tuned model is built with besides the checkpoint's
            architecture: a mapping, or `settings(source_config) -> dict` (a callable or
            "module:function"), `source_config` being the pretrained model's `get_config()` or
            a checkpoint's config (ViT: dropout 0 and the model's remat; EfficientNet: its
            architecture's dropout and drop-path rates).
        options: the model arguments a caller may set for fine-tuning (`for_finetuning(
            dropout_rate=...)`); the others are refused with the list of these.
        resizable: whether the fine-tuned model may take another input size than the pretrained
            one (position embeddings resized, or a fully convolutional network).
        resolution: the default fine-tuning resolution, `resolution(config, data_size) ->
            (height, width)` or None for the pretrained model's own; `data_size` is the
            (height, width) of the task's images when known, else None.
        features: names of the layers whose output is the pooled representation the head reads,
            first found first; a model without any of them (headless, unpooled) has its output
            pooled by the family's `features_pooling` (None: its classifier's rule).
    """

    settings: Any = dataclasses.field(default_factory=dict)
    options: tuple = ()
    resizable: bool = True
    resolution: Any = None
    features: tuple = ("pre_logits", "pool")

    def model_settings(self, source_config):
        """{model argument: value} the fine-tuned model of `source_config` is built with."""
        settings = self.settings
        if not isinstance(settings, Mapping):
            settings = _resolve(settings)(dict(source_config))
        return dict(settings)

    def default_resolution(self, config, data_size=None):
        """(height, width) to fine-tune `config`'s model at when none is asked for, or None (its own)."""
        if self.resolution is None:
            return None
        return optional_pair(_resolve(self.resolution)(config, optional_pair(data_size)))


# === Rules the family records name ===


def dropout_free_settings(source_config):
    """A transformer's fine-tuning: no dropout (the paper fine-tunes with 0), the model's remat."""
    return {"dropout_rate": 0.0, "attention_dropout_rate": 0.0, "remat": bool(source_config.get("remat", False))}


#: BiT-HyperRule's resolution (google-research/big_transfer `bit_hyperrule.get_resolution`):
#: images of less than 96 x 96 pixels are fine-tuned at 128 px (a crop of 160), larger ones at
#: 480 px (a crop of 512).
BIT_SMALL_AREA, BIT_SMALL_RESOLUTION, BIT_LARGE_RESOLUTION = 96 * 96, 128, 480


def bit_hyperrule_resolution(config, data_size):
    """BiT-HyperRule's fine-tuning resolution for images of `data_size` (None: the model's own)."""
    if data_size is None:
        return None
    side = BIT_SMALL_RESOLUTION if data_size[0] * data_size[1] < BIT_SMALL_AREA else BIT_LARGE_RESOLUTION
    return side, side
