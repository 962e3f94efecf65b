"""`keras-vit presets [ARCH]`: the table of published weights."""


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "presets",
        help="list the published weights (tags, resolutions, classes, ImageNet top-1, GFLOPs, input, licence, "
        "Hub repos)",
        description="List the pretrained weights of every constructor, or of ARCH only. "
        "Load one with keras_vit.ARCH(weights=TAG) or keras_vit.load_checkpoint('ARCH.TAG').",
    )
    parser.add_argument("architecture", nargs="?", metavar="ARCH", help="a constructor name, e.g. ViTB16")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.set_defaults(func=run)


def format_table(rows, headers):
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


#: Short names of the input normalisations of the table (mean and std of [0, 1] pixels).
_INPUTS = {
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)): "[-1,1]",
    ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)): "imagenet",
    ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)): "clip",
}


def input_name(preset):
    """"[-1,1]", "imagenet", "clip", or "mean=... std=..." for the input a preset's weights expect."""
    key = (tuple(float(v) for v in preset.mean), tuple(float(v) for v in preset.std))
    return _INPUTS.get(key) or f"mean={list(key[0])} std={list(key[1])}"


def license_name(preset):
    """The licence, marked "(non-commercial)" where it allows no commercial use; "-" when unknown."""
    if preset.license is None:
        return "-"
    return preset.license + (" (non-commercial)" if preset.non_commercial else "")


def run(args):
    import dataclasses
    import json

    from keras_vit import presets
    from keras_vit.flops import flops

    rows = presets.list_presets(args.architecture)
    if args.json:
        print(json.dumps([dataclasses.asdict(p) for p in rows], indent=1))
        return 0
    aliases = {}
    for arch in dict.fromkeys(p.architecture for p in rows):
        for alias in presets.ALIASES:
            try:
                chosen = presets.find_preset(arch, alias)
            except ValueError:
                continue
            aliases.setdefault((arch, chosen.tag), []).append(alias)
    table = [
        (
            p.architecture,
            p.tag,
            p.resolution,
            p.classes or "-",
            f"{p.top1:.2f}" if p.top1 is not None else "-",
            f"{flops(p.architecture, p.resolution, classes=p.classes) / 1e9:.1f}",
            ", ".join(aliases.get((p.architecture, p.tag), [])),
            input_name(p),
            license_name(p),
            p.repo,
        )
        for p in rows
    ]
    headers = ("ARCH", "TAG", "RES", "CLASSES", "TOP-1", "GFLOPS", "ALIAS", "INPUT", "LICENSE", "HUB REPO")
    print(format_table(table, headers))
    print(f"\n{len(rows)} presets. Top-1: ImageNet-1k accuracy reported by the source; CLASSES '-': no head. "
          "GFLOPS: forward FLOPs per image at RES (keras_vit.flops). INPUT: the normalisation the weights expect "
          "(keras_vit.preprocess_input(x, model=model) applies it). LICENSE: the weights' licence (timm's "
          "pretrained_cfg); a model loaded from non-commercial weights says so once.")
    return 0
