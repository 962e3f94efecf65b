"""The storage floor: how weights and configs sit in files, below every model family and every
checkpoint format. Nothing here knows a model; `keras_vit.checkpoints` maps what these modules
read to the canonical weight tree.

- `files`: the table of file kinds and their name endings, telling a file's kind from its bytes,
  and the errors of a file that cannot be read;
- `json_files`: the one reader of a JSON object from a file;
- `lazy`: `LazyArray`, a tensor read when it is converted;
- `safetensors`: safetensors files, one tensor at a time, and memory-mapped reads;
- `torch_zip`: `torch.save` zip files read without running their pickle;
- `keras_archive`: the members of a `.keras` zip archive and of Keras' weights `.h5`.
"""
