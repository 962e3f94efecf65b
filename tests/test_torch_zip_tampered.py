"""A timm folder whose pytorch_model.bin changes its first tensor's layout after the layout was
checked (a pickle BUILD setting the offset, stride or shape), loaded through
`keras_vit.load_checkpoint` in a fresh process on each backend: each ends in a CheckpointError
naming the file (no crash, no MemoryError, no values read from outside the file), and the
untouched file loads to timm's own weights.
"""

import json
import os

import numpy as np
from conftest import run_python
from torch_zip_files import TAMPERED_LAYOUTS, build, state_dict_bytes

_LOAD = """
import json
import numpy as np
import keras_vit
from keras_vit.models.weight_tree import get_weight_tree
result = {}
for folder in FOLDERS:
    try:
        model = keras_vit.load_checkpoint(folder)
    except keras_vit.CheckpointError as err:
        result[folder] = "CheckpointError: " + str(err)
    else:
        tree = get_weight_tree(model)
        result[folder] = {k: np.asarray(tree[k]).tolist() for k in ("cls", "head/kernel")}
print(json.dumps(result))
"""


def test_tampered_layouts_are_refused_in_a_fresh_process_and_the_untouched_file_loads(tmp_path):
    # The reference weights: a random timm ViT (conftest imports timm before TensorFlow).
    import timm
    import torch

    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert next(iter(state)) == "cls_token"  # the tensor the tampered files change
    config = json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 5, "model_args": args})
    folders = {}
    for case, tamper in [("untouched", b""), *((slot, build(slots)) for slot, slots in TAMPERED_LAYOUTS.items())]:
        folder = folders[case] = tmp_path / case
        folder.mkdir()
        (folder / "config.json").write_text(config)
        (folder / "pytorch_model.bin").write_bytes(state_dict_bytes(state, tamper=tamper))
    # One fresh process for all four: a read outside the storage can crash it (SIGSEGV), which
    # run_python reports as a failure with the exit status.
    code = f"FOLDERS = {[str(f) for f in folders.values()]!r}\n" + _LOAD
    result = json.loads(run_python(code).strip().splitlines()[-1])
    loaded = result[str(folders["untouched"])]
    np.testing.assert_array_equal(np.asarray(loaded["cls"]), state["cls_token"])
    np.testing.assert_array_equal(np.asarray(loaded["head/kernel"]), state["head.weight"].T)
    for slot in TAMPERED_LAYOUTS:
        outcome = result[str(folders[slot])]
        assert isinstance(outcome, str), f"{slot}: the tampered file loaded"
        assert outcome.startswith("CheckpointError: "), outcome
        assert os.path.join(str(folders[slot]), "pytorch_model.bin") in outcome, outcome
        assert "sets the state (BUILD) of a TorchTensor" in outcome, outcome
