"""A Flax (linen) ViT and its optax fine-tuning step, written as a JAX user writes them.

The module layout follows the original code's (google-research/vision_transformer,
vit_jax/models_vit.py): a patch-embedding conv "embedding", a class token "cls", learned position
embeddings "posembed_input", pre-LN encoder blocks (LayerNorm, multi-head dot-product attention,
LayerNorm, a GELU MLP), "encoder_norm", a zero-initialised "head". `dtype` is the computation
dtype (bfloat16 for mixed precision), the parameters stay float32, as in the original.

The train step is the original fine-tuning update in optax form: softmax cross-entropy on the
logits, gradients clipped to global norm 1, SGD with momentum 0.9 under a warm-up + cosine
schedule; one `jax.jit` with the parameters and optimizer state donated.

Used by train_step.py (the cross-framework table) and profile_jax_train.py.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

#: (hidden, mlp, heads, layers, patch) of the models the benchmarks time.
ARCHITECTURES = {
    "Ti16": (192, 768, 3, 12, 16),
    "B16": (768, 3072, 12, 12, 16),
    "L16": (1024, 4096, 16, 24, 16),
    "H14": (1280, 5120, 16, 32, 14),
}


class MlpBlock(nn.Module):
    mlp_dim: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        width = x.shape[-1]
        dense = functools.partial(
            nn.Dense, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
            bias_init=nn.initializers.normal(stddev=1e-6),
        )
        x = dense(self.mlp_dim, name="Dense_0")(x)
        x = nn.gelu(x)  # the tanh form, as the original
        return dense(width, name="Dense_1")(x)


class Encoder1DBlock(nn.Module):
    mlp_dim: int
    num_heads: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm(dtype=self.dtype, name="LayerNorm_0")(x)
        y = nn.MultiHeadDotProductAttention(
            num_heads=self.num_heads, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
            deterministic=True, name="MultiHeadDotProductAttention_1",
        )(y, y)
        x = x + y
        y = nn.LayerNorm(dtype=self.dtype, name="LayerNorm_2")(x)
        return x + MlpBlock(self.mlp_dim, dtype=self.dtype, name="MlpBlock_3")(y)


class VisionTransformer(nn.Module):
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    patch_size: int
    num_classes: int = 1000
    dtype: jnp.dtype = jnp.float32
    remat: bool = False

    @nn.compact
    def __call__(self, images):
        p = self.patch_size
        x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding="VALID", dtype=self.dtype, name="embedding")(
            images
        )
        n, h, w, c = x.shape
        x = jnp.reshape(x, (n, h * w, c))
        cls = self.param("cls", nn.initializers.zeros, (1, 1, c))
        x = jnp.concatenate([jnp.tile(cls, (n, 1, 1)).astype(x.dtype), x], axis=1)
        pos = self.param("posembed_input", nn.initializers.normal(stddev=0.02), (1, x.shape[1], c))
        x = x + pos.astype(x.dtype)
        block = nn.remat(Encoder1DBlock) if self.remat else Encoder1DBlock
        for i in range(self.num_layers):
            x = block(self.mlp_dim, self.num_heads, dtype=self.dtype, name=f"encoderblock_{i}")(x)
        x = nn.LayerNorm(dtype=self.dtype, name="encoder_norm")(x)
        x = x[:, 0]
        return nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros, name="head")(x)


def make_model(arch="B16", dtype="float32", num_classes=1000, remat=False):
    hidden, mlp, heads, layers, patch = ARCHITECTURES[arch]
    return VisionTransformer(hidden, mlp, heads, layers, patch, num_classes, dtype=jnp.dtype(dtype), remat=remat)


def finetune_tx(base_lr=0.003, total_steps=10_000, warmup_steps=500, clip=1.0):
    """The original fine-tuning optimizer: clip to global norm, SGD momentum 0.9, warm-up + cosine."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, base_lr, warmup_steps, total_steps)
    return optax.chain(optax.clip_by_global_norm(clip), optax.sgd(schedule, momentum=0.9))


def make_train_step(model, tx):
    """A jitted (params, opt_state, images, labels) -> (params, opt_state, loss); params and
    state donated."""

    def loss_fn(params, images, labels):
        logits = model.apply({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def init_params(model, image_size=224, seed=0):
    """Random parameters, initialised by one jitted init (float32)."""
    images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    return jax.jit(model.init)(jax.random.PRNGKey(seed), images)["params"]
