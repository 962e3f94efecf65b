"""Writes keras_vit/checkpoints/timm_vit_architectures.json: timm's ViT architectures (the
entrypoints of timm/models/vision_transformer.py, deit.py, beit.py and eva.py) with the keyword
arguments each passes to its model class (VisionTransformer, Beit, Eva), and every pretrained tag
with its pretrained_cfg.

Run with timm installed (a tool, not a dependency of keras_vit):
    python weights/timm_vit_table.py
keras_vit reads the generated JSON without timm.
"""

import functools
import json
import os
import sys

import timm
import timm.models.beit as beit
import timm.models.deit as deit
import timm.models.eva as eva
import timm.models.vision_transformer as vt

OUT = os.path.join(os.path.dirname(__file__), "..", "keras_vit", "checkpoints", "timm_vit_architectures.json")
#: {module name: (module, the function its entrypoints call with the model's keyword arguments)}
MODULES = {
    "vision_transformer": (vt, "_create_vision_transformer"),
    "deit": (deit, "_create_deit"),
    "beit": (beit, "_create_beit"),
    "eva": (eva, "_create_eva"),
}
CFG_KEYS = ("num_classes", "input_size", "mean", "std", "license", "interpolation", "crop_pct", "hf_hub_id")


def _name(value):
    """A layer argument as a JSON value: its timm name (functools.partial keeps its keywords)."""
    if isinstance(value, functools.partial):
        return {"name": _name(value.func), **{k: _name(v) for k, v in value.keywords.items()}}
    if isinstance(value, type) or callable(value):
        return getattr(value, "__name__", repr(value))
    if isinstance(value, tuple):
        return [_name(v) for v in value]
    return value


class _Captured(Exception):
    pass


def _capture(module, creator):
    """The keyword arguments the entrypoints of `module` pass to `creator` (called, never built)."""
    seen = {}

    def fake(variant, pretrained=False, **kwargs):
        seen["args"] = kwargs
        raise _Captured

    original = getattr(module, creator)
    setattr(module, creator, fake)
    try:
        out = {}
        for arch in timm.list_models(module=module.__name__.rsplit(".", 1)[1]):
            seen.clear()
            try:
                timm.models._registry.model_entrypoint(arch)()
            except _Captured:
                out[arch] = {k: _name(v) for k, v in sorted(seen["args"].items())}
            else:
                raise RuntimeError(f"{arch}: the entrypoint did not call {creator}")
        return out
    finally:
        setattr(module, creator, original)


def main():
    table = {"timm_version": timm.__version__, "modules": {}}
    for name, (module, creator) in MODULES.items():
        args = _capture(module, creator)
        tags = {}
        for tag in timm.list_pretrained():
            arch = tag.split(".", 1)[0]
            if arch in args:
                cfg = timm.models.get_pretrained_cfg(tag).to_dict()
                tags[tag] = {k: _name(cfg.get(k)) for k in CFG_KEYS}
        used = {t.split(".", 1)[0] for t in tags}
        table["modules"][name] = {
            "architectures": {a: args[a] for a in sorted(args)},
            "pretrained": dict(sorted(tags.items())),
            "pretrained_architectures": len(used),
        }
        print(f"{name}: {len(args)} architectures, {len(tags)} pretrained tags ({len(used)} architectures)")
    with open(OUT, "w") as f:
        json.dump(table, f, indent=1, sort_keys=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
