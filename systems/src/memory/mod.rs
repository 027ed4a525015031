//! Memory planning: tensor lifetimes and offsets in per-processor regions.
