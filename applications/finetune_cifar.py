"""Fine-tune a Vision Transformer with the paper's transfer recipe, on the public keras_vit API.

    # CIFAR-10 at 384 from ImageNet-21k weights (needs the tfds data and the weights cached):
    python applications/finetune_cifar.py --data tfds:cifar10 --arch ViTB16 --weights augreg_in21k \
        --image-size 384 --steps 10000 --batch-size 512 --lr 0.01 --warmup 500
    # Offline, on embedded data (default), from scratch with a small ViT:
    python applications/finetune_cifar.py --steps 200

Recipe: SGD momentum 0.9, global-norm clip 1.0, warm-up then cosine decay, Inception crop +
flip, position embeddings resized and a zero head (`keras_vit.training.for_finetuning`).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_vit  # noqa: E402
import keras_vit.data  # noqa: E402
from keras_vit.training import classification_loss, finetune_optimizer, for_finetuning  # noqa: E402

#: The small ViT used when no --arch/--weights is given (trains in a minute on a CPU).
SMALL_VIT = dict(patch_size=4, hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128)


def build_model(args, classes):
    if args.weights and args.weights.endswith(".keras"):
        base = keras.saving.load_model(args.weights, compile=False)
    elif args.weights:
        base = getattr(keras_vit, args.arch)(weights=args.weights) if args.arch else keras_vit.load_checkpoint(
            args.weights)
    elif args.arch:
        return getattr(keras_vit, args.arch)(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                             classes=classes)
    else:
        return keras_vit.VisionTransformer(image_size=args.image_size, classes=classes, **SMALL_VIT)
    # Pretrained: same weights at the new resolution, new zero-initialised head.
    return for_finetuning(base, image_size=args.image_size, classes=classes)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="shapes", help="tfds:cifar10, tfds:cifar100, digits, shapes or a folder")
    parser.add_argument("--arch", default=None, help="constructor name, e.g. ViTB16 (default: a small ViT)")
    parser.add_argument("--weights", default=None, help="preset tag (with --arch), checkpoint path or .keras file")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="write the fine-tuned model to this .keras file")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(args.seed)
    train_ds, info = keras_vit.data.load_dataset(args.data, "train", image_size=args.image_size,
                                                 batch_size=args.batch_size, training=True, seed=args.seed)
    test_ds, _ = keras_vit.data.load_dataset(args.data, "test", image_size=args.image_size, batch_size=256)
    model = build_model(args, info.num_classes)
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    model.compile(optimizer=finetune_optimizer(args.lr, total_steps=args.steps, warmup_steps=warmup),
                  loss=classification_loss(model), metrics=["accuracy"])
    model.fit(train_ds, steps_per_epoch=args.steps, epochs=1, verbose=1, shuffle=False)
    loss, accuracy = model.evaluate(test_ds, verbose=0)
    if args.save:
        model.save(args.save)
    print(f"{info.name} test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main()
