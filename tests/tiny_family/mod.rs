//! Tiny synthetic GGUF files of each model family row (seeded random weights, written by
//! the project's GGUF writer) with every tensor the row needs: its biases, QK-norm and
//! post-norm weights, and for a row with local layers the sliding window and a global RoPE
//! base of 1e6. Shared by the root's family tests.

use hetsched::import::MetadataValue as V;
use hetsched::import::family;
use hetsched::import::gguf::writer::{GgufWriter, TinyModel, seeded_values};

/// The sizes of a tiny file: 2 query heads and 1 KV head of `hidden / 2`.
#[derive(Clone, Copy)]
pub struct Sizes {
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// Keys a local layer attends to (written for a row with local layers).
    pub window: u32,
}

/// A file of row `arch` with `layers` blocks of `sizes`, with `more` adding metadata or
/// tensors before it is written.
pub fn tiny_family_bytes(
    arch: &str,
    layers: usize,
    sizes: Sizes,
    more: impl FnOnce(&mut GgufWriter),
) -> Vec<u8> {
    let row = family::family(arch).unwrap();
    let (heads, kv_heads) = (2, 1);
    let m = TinyModel {
        arch,
        layers,
        hidden: sizes.hidden,
        heads,
        kv_heads,
        ffn: sizes.ffn,
        vocab: sizes.vocab,
        context: 64,
        tied: true,
    };
    let mut w = GgufWriter::tiny_model(&m, seeded_values);
    if row.sliding_window_period > 0 {
        w.kv(&row.key("attention.sliding_window"), V::U32(sizes.window));
        w.kv(&row.key("rope.freq_base"), V::F32(1e6));
    }
    let (h, d) = (sizes.hidden, sizes.hidden / heads);
    let kv = d * kv_heads;
    for i in 0..layers {
        let mut extra: Vec<(&str, usize)> = Vec::new();
        if row.qkv_bias {
            extra.extend([("attn_q.bias", h), ("attn_k.bias", kv), ("attn_v.bias", kv)]);
        }
        if row.qk_norm {
            extra.extend([("attn_q_norm.weight", d), ("attn_k_norm.weight", d)]);
        }
        if row.post_norms {
            extra.extend([
                ("post_attention_norm.weight", h),
                ("post_ffw_norm.weight", h),
            ]);
        }
        for (name, len) in extra {
            let name = format!("blk.{i}.{name}");
            w.tensor_f32(&name, &[len], &seeded_values(&name, len));
        }
    }
    more(&mut w);
    w.to_bytes()
}
