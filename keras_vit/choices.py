"""The names a model config may give its layers' switches.

Kept free of Keras and the backends, so that a config validates (e.g. in the CLI's checks before
anything loads) without importing them; the layers take their choices from here too.
"""

#: The norms a ViT's blocks can use: "layer_norm" (the original's) and "rms_norm" (AIMv2's).
NORMS = ("layer_norm", "rms_norm")

#: MLP activations: "gelu" (erf), "gelu_tanh", "quick_gelu" (x * sigmoid(1.702 x), OpenAI CLIP's),
#: "silu". None: GELU in the form `gelu_approximate` says (the original and timm's default).
MLP_ACTIVATIONS = (None, "gelu", "gelu_tanh", "quick_gelu", "silu")
