"""keras_vit.training: the paper's training recipes for Keras 3 (`model.fit` on JAX, TF, torch).

Summary of the public API (all importable from `keras_vit.training`):

Schedules (registered LearningRateSchedules; the rate of update t = iterations, from 0, as the
original create_learning_rate_schedule; docs/training.md):
    WarmupDecay(base_learning_rate, total_steps, warmup_steps=0, decay="cosine"|"linear",
                end_learning_rate=0.0)
    WarmupCosineDecay(base, total_steps, warmup_steps)           # fine-tuning
    WarmupLinearDecay(base, total_steps, warmup_steps, end_learning_rate=1e-5)   # pre-training
    warmup_decay_value(step, ...)                                # the formula in plain Python

Optimizers (optax's arithmetic in Keras SGD/AdamW subclasses; EMA moves once per applied update
under gradient accumulation):
    finetune_optimizer(learning_rate=0.003, total_steps, warmup_steps=500, *, momentum=0.9,
                       momentum_dtype=None|"bfloat16", decay="cosine"|"linear",
                       global_clipnorm=1.0, gradient_accumulation_steps=None, use_ema=False,
                       ema_momentum=0.9999)      -> SGD: clip, trace = g + 0.9 trace,
                                                    w -= rate_t * trace (vit_jax/train.py)
    pretrain_optimizer(learning_rate=1e-3, total_steps, warmup_steps=10_000, *, weight_decay=0.1,
                       beta_1=0.9, beta_2=0.999, epsilon=1e-8, end_learning_rate=1e-5,
                       global_clipnorm=1.0, weight_decay_pattern="kernel$",
                       gradient_accumulation_steps=None, ...)
                                                 -> AdamW: clip, optax adamw, decay rate_t * 0.1 * w
                                                    on kernels only (big_vision)
    SGD, AdamW                                   # the optimizer classes; learning_rate_scales=
                                                 {variable path: scale} per-variable rates
    layer_decay_scales(model, layer_decay, *, min_scale=0.0)
                                                 -> timm's layer-wise lr decay scales; also
                                                    finetune/pretrain_optimizer(layer_decay=, model=)
    timm_weight_decay(model)                     -> the variable paths timm's weight-decay rule
                                                    decays; AdamW(decayed_variables=),
                                                    pretrain_optimizer(weight_decay_rule="timm", model=)

Recipes:
    for_finetuning(model, *, image_size=None, classes, classifier_activation=<model's>,
                   keep_representation=False, patch_drop_rate=None)  -> new VisionTransformer,
                   weights copied, position embedding resized, zero head(s), pre_logits dropped,
                   dropout 0 (patch dropout as asked)
    classification_loss(model=None, *, label_smoothing=0.0, from_logits=None)
                   -> ClassificationCrossentropy (integer or one-hot labels, label smoothing)
    PRETRAIN_DROPOUT                                         # {"ViTL16": 0.1, "ViTH14": 0.1}

DeiT hard distillation:
    HardDistillation(student, teacher=None, *, label_smoothing=0.0)
                   a keras.Model to compile and fit: 0.5 CE(head, y) + 0.5 CE(head_dist, argmax
                   teacher(x)); without a teacher, fit(images, (labels, teacher_logits))

Callbacks:
    SwapEMAWeights()                 evaluate (validation / evaluate) with the EMA weights
    EMAModelCheckpoint(filepath,...) ModelCheckpoint that writes the EMA weights
    ema_weights(model)               context manager: EMA weights in, then back
    BackupAndResume(backup_dir, save_freq="epoch"|int)   resumable backup incl. optimizer state;
                                     resumes mid-epoch (runs the remaining steps of that epoch)
    backup_progress(backup_dir)      -> {"epoch", "batch", "step"} or None; skip `step` batches
                                     of a streamed dataset to continue exactly
    FewShotProbe(train_images, train_labels, test_images, test_labels, *, l2_reg=1024.0,
                 every_epochs=1, name="fewshot_accuracy")   logs few-shot accuracy each epoch
    finetune_callbacks(*, backup_dir=None, save_freq="epoch", checkpoint_path=None, ema=False,
                       fewshot=None)  -> the list above, in a working order

Few-shot linear evaluation (NumPy):
    fewshot_linear_eval(train_features, train_labels, test_features, test_labels, *,
                        l2_reg=1024.0, num_classes=None, normalize=True, bias=100.0) -> accuracy
    fewshot_linear_weights(...), fewshot_predict(solution, features), sample_shots(labels, shots)
    extract_features(model, data, *, batch_size=64, return_labels=False) -> (N, D) float32

Masked patch prediction (the pilot):
    MaskedPatchPrediction(encoder, *, corrupt_rate=0.5, mask_rate=0.8, random_rate=0.1,
                          colour_bits=3, seed=None)   .fit(images); .encoder; .encoder_weight_tree()
    colour_targets(images, patch_size, bits=3) -> (batch, patches) int classes in [0, 512)

Example:
    >>> import keras_vit
    >>> from keras_vit import training
    >>> base = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
    ...     num_layers=1, num_heads=2, mlp_dim=32, classes=10)
    >>> model = training.for_finetuning(base, image_size=48, classes=3, classifier_activation=None)
    >>> model.compile(optimizer=training.finetune_optimizer(0.01, total_steps=100, warmup_steps=10),
    ...               loss=training.classification_loss(model))
"""

from keras_vit.training.callbacks import (  # noqa: F401
    BackupAndResume,
    EMAModelCheckpoint,
    FewShotProbe,
    SwapEMAWeights,
    backup_progress,
    ema_weights,
    finetune_callbacks,
)
from keras_vit.training.distillation import HardDistillation  # noqa: F401
from keras_vit.training.fewshot import (  # noqa: F401
    extract_features,
    feature_model,
    fewshot_linear_eval,
    fewshot_linear_weights,
    fewshot_predict,
    sample_shots,
)
from keras_vit.training.optimizers import (  # noqa: F401
    SGD,
    AdamW,
    finetune_optimizer,
    layer_decay_scales,
    pretrain_optimizer,
    timm_weight_decay,
)
from keras_vit.training.pilot import MaskedPatchPrediction, colour_targets  # noqa: F401
from keras_vit.training.recipes import (  # noqa: F401
    PRETRAIN_DROPOUT,
    ClassificationCrossentropy,
    classification_loss,
    for_finetuning,
)
from keras_vit.training.schedules import (  # noqa: F401
    WarmupCosineDecay,
    WarmupDecay,
    WarmupLinearDecay,
    warmup_decay_value,
)
