"""PyTorch zip files written by hand, without torch: the pickle opcodes of a torch.save file
emitted one by one (so a test controls every field) and packed as torch.save packs them; valid
samples (a state dict, an axial-deeplab .pth.tar, the edge cases of `edge_torch_files`: deflated
members, a big-endian file, a tensor ending on its storage's last element) and the hostile ones
of `hostile_torch_files` (pickles that would run code or change a tensor, a storage or a dict
after it is built, storages and tensors claiming more than the file holds, truncations, a CRC
failure, a deflate bomb, a bad byte order, a legacy file). Used by test_torch_zip and the
hostile-file matrix.
"""

import io
import os
import pickle
import struct
import zipfile

import numpy as np

def _str(s):
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(n):
    if 0 <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def _tuple(items):
    return b"(" + b"".join(items) + b"t"


def _tensor(key, numel, shape, stride, offset=0, storage="FloatStorage"):
    """The opcodes of torch._utils._rebuild_tensor_v2(storage, offset, shape, stride, False, {})."""
    pid = _tuple([_str("storage"), b"ctorch\n" + storage.encode() + b"\n", _str(key), _str("cpu"), _int(numel)])
    args = [pid + b"Q", _int(offset), _tuple(map(_int, shape)), _tuple(map(_int, stride)), b"\x89", b"}"]
    return b"ctorch._utils\n_rebuild_tensor_v2\n" + _tuple(args) + b"R"


def build(slots):
    """The opcodes of a BUILD with state (None, {slot: value}) on the object on top of the stack:
    what a hostile file appends to a rebuilt tensor or storage to change it after its check."""
    value = lambda v: _tuple(map(_int, v)) if isinstance(v, tuple) else _int(v)  # noqa: E731
    return b"N}(" + b"".join(_str(k) + value(v) for k, v in slots.items()) + b"u\x86b"


#: The layouts the tests set by BUILD on a rebuilt 3-D float32 tensor: an offset far outside the
#: file (reads the process's memory), strides that do (a crash, SIGSEGV) and a shape of 10^15
#: elements.
TAMPERED_LAYOUTS = {
    "offset": {"offset": 10**9},
    "stride": {"stride": (10**9, 10**9, 10**9)},
    "shape": {"shape": (10**5, 10**5, 10**5), "stride": (1, 1, 1)},
}


def _dict(entries):
    """The opcodes of a dict {name: opcodes}."""
    return b"}(" + b"".join(_str(name) + value for name, value in entries.items()) + b"u"


def state_pickle(entries):
    """A protocol-2 pickle of {name: opcodes} (values are opcode strings such as `_tensor(...)`)."""
    return b"\x80\x02" + _dict(entries) + b"."


def state_dict_bytes(arrays, wrap=None, prefix="", tamper=b""):
    """A torch.save zip of the state dict {name: float32 / int64 array}, each tensor its own
    contiguous storage; `wrap` (e.g. "state_dict") nests it as {"epoch": 1, wrap: state}, as
    training scripts save it, `prefix` ("module.") prefixes every key, and `tamper` (opcodes such
    as `build(...)`) follows the first tensor's rebuild."""
    entries, storages = {}, {}
    for i, (name, value) in enumerate(arrays.items()):
        value = np.ascontiguousarray(value)
        kind = {"f": "FloatStorage", "i": "LongStorage"}[value.dtype.kind]
        value = value.astype(np.float32 if kind == "FloatStorage" else np.int64)
        strides = tuple(s // value.itemsize for s in value.strides)
        entries[prefix + name] = _tensor(str(i), value.size, value.shape, strides, storage=kind) + (b"" if i else tamper)
        storages[str(i)] = value.tobytes()
    body = _dict(entries)
    if wrap is not None:
        body = b"}(" + _str("epoch") + _int(1) + _str(wrap) + body + b"u"
    return torch_zip_bytes(b"\x80\x02" + body + b".", storages)


def axial_deeplab_state(tree):
    """The state dict axialnet.py's AxialAttentionNet holds for an AxialResNet weight tree (the
    inverse of the reader's mapping, written out), its buffers included."""
    bn = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}
    state = {}
    for key, value in tree.items():
        value = np.asarray(value)
        module, leaf = key.rsplit("/", 1)
        name = module.replace("/", ".")
        if leaf in bn:
            state[f"{name}.{bn[leaf]}"] = value
            if leaf == "moving_variance":
                state[f"{name}.num_batches_tracked"] = np.array(100, np.int64)
        elif module.endswith("qkv_transform"):
            state[f"{name}.weight"] = value.T[:, :, None]
        elif leaf == "kernel" and value.ndim == 4:
            state[f"{name}.weight"] = value.transpose(3, 2, 0, 1)
        elif key == "fc/kernel":
            state["fc.weight"] = value.T
        elif leaf == "relative":
            span = (value.shape[1] + 1) // 2
            i = np.arange(span)
            state[f"{name}.relative"] = value
            state[f"{name}.flatten_index"] = (i[:, None] - i[None, :] + span - 1).reshape(-1).astype(np.int64)
        else:
            state[f"{name}.{leaf}"] = value
    return state


def torch_zip_bytes(pickle_bytes, storages, prefix="archive", byteorder="little", compression=zipfile.ZIP_STORED):
    """A zip laid out as torch.save lays it out: data.pkl, data/<key> (stored), version, byteorder
    (`byteorder` and `compression` change what torch.save writes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as z:
        z.writestr(f"{prefix}/data.pkl", pickle_bytes)
        z.writestr(f"{prefix}/byteorder", byteorder)
        for key, data in storages.items():
            z.writestr(f"{prefix}/data/{key}", data)
        z.writestr(f"{prefix}/version", "3\n")
    return buffer.getvalue()


def valid_state_file():
    """(bytes, {name: expected array}) of a small valid state dict written by hand."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    b = np.array([1.5, -2.0], np.float32)
    data = state_pickle({"w": _tensor("0", 12, (3, 4), (4, 1)), "b": _tensor("1", 2, (2,), (1,))})
    return torch_zip_bytes(data, {"0": w.tobytes(), "1": b.tobytes()}), {"w": w, "b": b}


class _Payload:
    """Pickles as a call of `func(*args)`: what a hostile checkpoint does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _code_pickles(marker):
    """Pickles that would run code (each creates `marker` when unpickled with pickle.load)."""
    import builtins
    import subprocess

    return {
        "os.system": pickle.dumps({"w": _Payload(os.system, f"touch {marker}")}, protocol=2),
        "builtins.eval": pickle.dumps({"w": _Payload(builtins.eval, f"open({str(marker)!r}, 'w')")}, protocol=2),
        "builtins.exec": pickle.dumps({"w": _Payload(builtins.exec, f"open({str(marker)!r}, 'w')")}, protocol=4),
        "subprocess.Popen": pickle.dumps([_Payload(subprocess.Popen, ["touch", str(marker)])], protocol=2),
        # protocol 0's INST opcode, which instantiates a named class with arguments
        "INST": b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n.",
        # a tensor whose storage type is a callable of another module
        "storage type": state_pickle({"w": _tensor("0", 1, (1,), (1,)).replace(b"ctorch\nFloatStorage", b"cos\nsystem")}),
    }


def hostile_torch_files(folder):
    """[(name, path, what the error must name)] of damaged torch zip files written into `folder`:
    pickles that would run code, storages and tensors claiming more than the file holds,
    truncations, a CRC failure, a legacy file, and a file whose storage member is missing."""
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, "ran")
    cases = []

    def write(name, data, expect):
        path = os.path.join(folder, f"{name.replace(' ', '_').replace('.', '_')}.pth")
        with open(path, "wb") as f:
            f.write(data)
        cases.append((name, path, expect))

    storages = {"0": np.zeros(12, np.float32).tobytes()}
    for name, data in _code_pickles(marker).items():
        expect = "(os|posix)\\.system" if name in ("INST", "storage type", "os.system") else name
        write(f"code {name}", torch_zip_bytes(data, storages), expect)
    huge = 25 * 10**9  # a 100 GB float32 storage
    write("huge storage", torch_zip_bytes(state_pickle({"w": _tensor("0", huge, (huge,), (1,))}), storages),
          "claims 25,000,000,000 elements")
    write("tensor past its storage", torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (10**6, 10**6), (1, 1))}),
                                                     storages), "reaches element")
    write("expanded tensor", torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (10**5, 12), (0, 1))}), storages),
          "overlapping strides")
    write("negative offset", torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (4,), (1,), offset=-3)}), storages),
          "malformed")
    write("unknown storage type", torch_zip_bytes(
        state_pickle({"w": _tensor("0", 1, (1,), (1,), storage="ComplexFloatStorage")}), storages),
        "ComplexFloatStorage")
    write("missing storage member", torch_zip_bytes(state_pickle({"w": _tensor("7", 1, (1,), (1,))}), storages),
          "no member data/7")
    # Opcodes that change what the unpickler built after its checks: BUILD on a rebuilt tensor (the
    # layouts of TAMPERED_LAYOUTS), on a storage and on a dict; SETITEM and APPENDS on a tensor; an
    # object made by calling a class (NEWOBJ).
    tensor = _tensor("0", 12, (1, 3, 4), (12, 4, 1))
    for slot, slots in TAMPERED_LAYOUTS.items():
        write(f"BUILD {slot} on a tensor", torch_zip_bytes(state_pickle({"w": tensor + build(slots)}), storages),
              r"sets the state \(BUILD\) of a TorchTensor")
    on_storage = tensor.replace(b"Q", b"Q" + build({"numel": 10**9}), 1)
    write("BUILD on a storage", torch_zip_bytes(state_pickle({"w": on_storage}), storages),
          r"sets the state \(BUILD\) of a _Storage")
    write("BUILD on a dict", torch_zip_bytes(b"\x80\x02" + _dict({"w": tensor}) + build({"w": 0}) + b".", storages),
          r"sets the state \(BUILD\) of a dict")
    write("SETITEM on a tensor", torch_zip_bytes(state_pickle({"w": tensor + _str("offset") + _int(10**9) + b"s"}),
                                                 storages), "sets an item of a TorchTensor")
    write("APPENDS to a tensor", torch_zip_bytes(state_pickle({"w": tensor + b"(" + _int(1) + b"e"}), storages),
          "appends to a TorchTensor")
    write("NEWOBJ OrderedDict", torch_zip_bytes(b"\x80\x02ccollections\nOrderedDict\n)\x81.", storages),
          r"calling a class \(NEWOBJ / OBJ\)")
    write("tensor one element past its storage", torch_zip_bytes(
        state_pickle({"w": _tensor("0", 12, (3, 4), (4, 1), offset=1)}), storages),
        "reaches element 12 of storage '0', which holds 12")
    write("bad byteorder", torch_zip_bytes(state_pickle({"w": tensor}), storages, byteorder="middle"),
          "byteorder 'middle' is neither 'little' nor 'big'")
    bomb = torch_zip_bytes(state_pickle({"w": tensor}), {"0": bytes(48 * 1024)}, compression=zipfile.ZIP_DEFLATED)
    write("deflated member over MAX_DEFLATE_RATIO", _claim_size(bomb, "archive/data/0", 4 * 10**9),
          r"member 'archive/data/0' claims 4,000,000,000 bytes from \d+ stored bytes")
    valid, _ = valid_state_file()
    for cut in (len(valid) // 4, len(valid) // 2, len(valid) - 30):
        write(f"truncated at {cut}", valid[:cut], "truncated|corrupt|not a PyTorch zip")
    flipped = bytearray(valid)
    at = valid.index(np.float32(1.5).tobytes())  # inside storage "1"
    flipped[at] ^= 0x40
    write("flipped storage byte", bytes(flipped), "CRC")
    legacy = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
    write("legacy torch file", legacy, "legacy")
    return cases


def _claim_size(data, name, size):
    """The zip `data` with member `name`'s uncompressed size set to `size` (< 2^32) in its local
    and central headers (a deflate bomb's claim)."""
    data = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo(name)
    struct.pack_into("<I", data, info.header_offset + 22, size)
    central = data.index(b"PK\x01\x02")  # the central directory's first entry
    while data[central + 46:central + 46 + len(name)] != name.encode():
        name_length, extra, comment = struct.unpack_from("<HHH", data, central + 28)
        central += 46 + name_length + extra + comment
    struct.pack_into("<I", data, central + 24, size)
    return bytes(data)


def edge_torch_files(folder):
    """[(name, path, {key: expected array})] of valid torch zip files at the edges of the format,
    written into `folder`: every member deflated; a big-endian file (byteorder "big") of float32,
    float16, bfloat16 and int64 tensors; a tensor whose last element is its storage's last."""
    os.makedirs(folder, exist_ok=True)
    cases = []
    base = np.arange(12, dtype=np.float32) / 7

    def write(name, data, expected):
        path = os.path.join(folder, f"{name.replace(' ', '_').replace('-', '_')}.pth")
        with open(path, "wb") as f:
            f.write(data)
        cases.append((name, path, expected))

    data, expected = valid_state_file()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        storages = {n.rsplit("/", 1)[1]: z.read(n) for n in z.namelist() if "/data/" in n}
        pickle_bytes = z.read("archive/data.pkl")
    write("deflated", torch_zip_bytes(pickle_bytes, storages, compression=zipfile.ZIP_DEFLATED), expected)
    half = np.array([0.5, -3.25, 65504.0], np.float16)
    bf16 = np.array([1.0, -2.5, 3.0e38, 1.0e-30], np.float32)
    bf16 = (bf16.view(np.uint32) & 0xFFFF0000).view(np.float32)  # bfloat16 values: the top 16 bits
    longs = np.array([-(2**40), 7, 2**62], np.int64)
    pickle_bytes = state_pickle({
        "f32": _tensor("0", 12, (3, 4), (4, 1)), "f16": _tensor("1", 3, (3,), (1,), storage="HalfStorage"),
        "bf16": _tensor("2", 4, (2, 2), (1, 2), storage="BFloat16Storage"),
        "i64": _tensor("3", 3, (3,), (1,), storage="LongStorage"),
    })
    big = {"0": base.astype(">f4").tobytes(), "1": half.astype(">f2").tobytes(),
           "2": (bf16.view(np.uint32) >> 16).astype(">u2").tobytes(), "3": longs.astype(">i8").tobytes()}
    write("big-endian", torch_zip_bytes(pickle_bytes, big, byteorder="big"),
          {"f32": base.reshape(3, 4), "f16": half, "bf16": bf16.reshape(2, 2).T, "i64": longs})
    # offset 2, shape (2, 2), stride (6, 3): elements 2, 5, 8 and 11, the storage's last
    write("tensor ending on its storage's last element", torch_zip_bytes(
        state_pickle({"w": _tensor("0", 12, (2, 2), (6, 3), offset=2)}), {"0": base.tobytes()}),
        {"w": np.array([[2, 5], [8, 11]], np.float32) / 7})
    return cases


def axial_deeplab_sample():
    """(bytes of a small axial-deeplab .pth.tar written without torch, its AxialResNet tree)."""
    from keras_vit.models import AxialResNet
    from keras_vit.models.weight_tree import get_weight_tree

    model = AxialResNet(image_size=32, block_units=(1, 1, 1, 1), width_multiplier=0.25, classes=3)
    tree = get_weight_tree(model)
    rng = np.random.default_rng(0)
    tree = {k: (v + rng.normal(0, 0.1, v.shape)).astype(np.float32) for k, v in tree.items()}  # no zero BN scales
    tree = {k: (np.abs(v) + 0.5 if k.endswith("moving_variance") else v) for k, v in tree.items()}
    return state_dict_bytes(axial_deeplab_state(tree), wrap="state_dict", prefix="module."), tree
