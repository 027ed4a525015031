//! Addresses in units of the alignment, and merged sets of address ranges: what the
//! placement ([`super::place`]) and its conflict index ([`super::occupancy`]) both read.

/// An address in the index, counted in units of the alignment: `u32` wherever the
/// region's aligned sizes add up to at most `u32::MAX` units (every arena the shipped
/// scenes plan), `u64` otherwise. The narrow width halves the index's memory (its
/// address sets are most of what a placement reads and what the planner allocates).
pub(super) trait Addr:
    Copy + Ord + Default + std::fmt::Debug + std::ops::Add<Output = Self>
{
    /// `self - other`, or zero when `other` is larger.
    fn saturating_sub(self, other: Self) -> Self;
    /// The value; `from_u64` is given only values that fit.
    fn to_u64(self) -> u64;
    fn from_u64(units: u64) -> Self;
}

impl Addr for u32 {
    fn saturating_sub(self, other: Self) -> Self {
        u32::saturating_sub(self, other)
    }
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
    fn from_u64(units: u64) -> Self {
        u32::try_from(units).expect("the narrow index is used only where every address fits")
    }
}

impl Addr for u64 {
    fn saturating_sub(self, other: Self) -> Self {
        u64::saturating_sub(self, other)
    }
    fn to_u64(self) -> u64 {
        self
    }
    fn from_u64(units: u64) -> Self {
        units
    }
}

/// The union of two merged address sets (sorted, disjoint, touching ranges joined)
/// into `out`, itself merged: one linear merge. Branch-free in its loop (which set
/// the next range comes from, and whether it joins the last one, are selects: both
/// are unpredictable). (Copying the longer set's runs in bulk between binary searches
/// was measured slower: 1.8x the chunk-1 run.)
pub(super) fn union_into<A: Addr>(a: &[(A, A)], b: &[(A, A)], out: &mut Vec<(A, A)>) {
    out.clear();
    let (Some(&first_a), Some(&first_b)) = (a.first(), b.first()) else {
        out.extend_from_slice(if a.is_empty() { b } else { a });
        return;
    };
    // Every range written is kept or overwritten by the next: at most one per input.
    out.resize(a.len() + b.len(), (A::default(), A::default()));
    let from_a = first_a.0 <= first_b.0;
    let (mut i, mut j) = (usize::from(from_a), usize::from(!from_a));
    let mut last = if from_a { first_a } else { first_b };
    let mut n = 0;
    let mut append = |next: (A, A), last: &mut (A, A), n: &mut usize| {
        let apart = next.0 > last.1;
        out[*n] = *last;
        *n += usize::from(apart);
        *last = if apart {
            next
        } else {
            (last.0, last.1.max(next.1))
        };
    };
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        let take_a = x.0 <= y.0;
        i += usize::from(take_a);
        j += usize::from(!take_a);
        append(if take_a { x } else { y }, &mut last, &mut n);
    }
    for &next in a[i..].iter().chain(&b[j..]) {
        append(next, &mut last, &mut n);
    }
    out[n] = last;
    out.truncate(n + 1);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::union_into;

    #[test]
    fn union_into_joins_overlapping_and_touching_ranges() {
        let mut out: Vec<(u64, u64)> = Vec::new();
        union_into(
            &[(0, 10), (20, 30), (50, 60)],
            &[(5, 20), (40, 45), (60, 70)],
            &mut out,
        );
        assert_eq!(out, [(0, 30), (40, 45), (50, 70)]);
        union_into(&[], &[(1, 2)], &mut out);
        assert_eq!(out, [(1, 2)]);
        union_into(&[(0, 100)], &[(10, 20), (30, 40)], &mut out);
        assert_eq!(out, [(0, 100)]);
    }

    /// A merged address set (sorted, disjoint, not touching) from random gaps and
    /// lengths, some gaps zero-length so neighbours would touch before merging.
    fn merged_set() -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((1u64..6, 1u64..6), 0..30).prop_map(|raw| {
            let mut at = 0;
            raw.into_iter()
                .map(|(gap, len)| {
                    at += gap;
                    let range = (at, at + len);
                    at += len;
                    range
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

        /// The bulk union equals a sort and merge of both sets' ranges.
        #[test]
        fn union_into_equals_sort_and_merge(a in merged_set(), b in merged_set()) {
            let mut all: Vec<(u64, u64)> = a.iter().chain(&b).copied().collect();
            all.sort_unstable();
            let mut expected: Vec<(u64, u64)> = Vec::new();
            for r in all {
                match expected.last_mut() {
                    Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
                    _ => expected.push(r),
                }
            }
            let mut out = Vec::new();
            union_into(&a, &b, &mut out);
            prop_assert_eq!(out, expected);
        }
    }
}
