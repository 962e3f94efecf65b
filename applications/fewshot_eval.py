"""Few-shot linear evaluation of a Vision Transformer's frozen features (the paper's Fig. 6 probe).

    # ImageNet-21k ViT-B/16 on CIFAR-100 (needs the tfds data and the weights cached):
    python applications/fewshot_eval.py --arch ViTB16 --weights augreg_in21k --data tfds:cifar100 \
        --image-size 224 --shots 1,5,10,25
    # Offline, a model saved by applications/finetune_cifar.py --save model.keras:
    python applications/fewshot_eval.py --weights model.keras --data digits

For each shot count: `shots` training images per class, pooled features, a closed-form
regularised least-squares classifier to {-1, 1}^K targets, accuracy on the test split.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_vit  # noqa: E402
import keras_vit.data  # noqa: E402
from keras_vit.training import extract_features, fewshot_linear_eval, for_finetuning, sample_shots  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True, help=".keras file, checkpoint path, or preset tag with --arch")
    parser.add_argument("--arch", default=None, help="constructor name for a preset tag, e.g. ViTB16")
    parser.add_argument("--data", default="digits", help="tfds:NAME, digits, shapes or an image folder")
    parser.add_argument("--image-size", type=int, default=None, help="default: the model's")
    parser.add_argument("--shots", default="1,5,10")
    parser.add_argument("--l2-reg", type=float, default=1024.0)
    parser.add_argument("--max-images", type=int, default=5000, help="images per split to featurise")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.weights.endswith(".keras"):
        model = keras.saving.load_model(args.weights, compile=False)
    elif args.arch:
        model = getattr(keras_vit, args.arch)(weights=args.weights)
    else:
        model = keras_vit.load_checkpoint(args.weights)
    if args.image_size and tuple(model.image_size) != (args.image_size, args.image_size):
        model = for_finetuning(model, image_size=args.image_size, classes=1)  # resized position embeddings
    image_size = tuple(model.image_size)

    def features(split):
        ds, info = keras_vit.data.load_dataset(args.data, split, image_size=image_size, batch_size=128)
        ds = ds.unbatch().take(args.max_images).batch(128)
        x, y = extract_features(model, ds, return_labels=True)
        return x, y, info

    train_x, train_y, info = features("train")
    test_x, test_y, _ = features("test")
    results = {}
    for shots in sorted(int(s) for s in args.shots.split(",")):
        chosen = sample_shots(train_y, shots, seed=args.seed)
        results[shots] = fewshot_linear_eval(train_x[chosen], train_y[chosen], test_x, test_y,
                                             l2_reg=args.l2_reg, num_classes=info.num_classes)
        print(f"{info.name}: {shots}-shot linear accuracy {results[shots]:.4f} "
              f"({len(test_y)} test images, {train_x.shape[1]}-d features)")
    return results


if __name__ == "__main__":
    main()
