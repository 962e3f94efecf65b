"""`keras-vit presets [ARCH]`: the table of published weights."""


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "presets",
        help="list the published weights (tags, resolutions, classes, ImageNet top-1, GFLOPs, Hub repos)",
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
            p.repo,
        )
        for p in rows
    ]
    print(format_table(table, ("ARCH", "TAG", "RES", "CLASSES", "TOP-1", "GFLOPS", "ALIAS", "HUB REPO")))
    print(f"\n{len(rows)} presets. Top-1: ImageNet-1k accuracy reported by the source; CLASSES '-': no head. "
          "GFLOPS: forward FLOPs per image at RES (keras_vit.flops).")
    return 0
