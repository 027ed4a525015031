//! Dot products of chosen rows of a row-major INT8 matrix with an f32 vector: a 4-bit
//! LM head's best candidates rescored from its INT8 rows, a hundred or so rows scattered
//! over tens of megabytes.
//!
//! Why a kernel: the rows are far apart, so each waits on memory. Fetched one after
//! another they took 0.6 µs a row of SmolLM2's head (576 bytes, cold) on this project's
//! 2-core EPYC, 128 of them 80 µs of a 2.9 ms decode step; with the lines of the rows
//! [`ROWS_AHEAD`] candidates on requested before each product, about half that.

use crate::prefetch::prefetch_lines;

/// Candidate rows whose lines are requested ahead of the one multiplied: a 4-bit head's
/// 128 candidates all at once. Timed in a decode step of `w4a8-g32` (SmolLM2, 128 rows of
/// 576 bytes, a faster 2-core EPYC than the one above, 2026-12-07): 8 ahead 31-35 µs, 16
/// ahead 28-34, 32 ahead 25-27, 64 ahead 27-30, 128 ahead 19-23.
const ROWS_AHEAD: usize = 128;

/// `out[i] = Σ_p rows[ids[i] · k + p] · x[p]` (`rows`: `[_, k]` row-major; `x`: `k`
/// values), each sum in 16 lanes added at the end (within f32 rounding of the exact
/// sum).
///
/// # Panics
/// If `x` or `out` has the wrong length, or an id names a row past `rows`.
pub fn chosen_row_dots(rows: &[i8], k: usize, ids: &[u32], x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), k, "x must have k values");
    assert_eq!(out.len(), ids.len(), "one output per chosen row");
    let row = |id: u32| -> &[i8] {
        let start = id as usize * k;
        rows.get(start..start + k)
            .unwrap_or_else(|| panic!("row {id} is past the {} rows", rows.len() / k.max(1)))
    };
    for &id in ids.iter().take(ROWS_AHEAD) {
        prefetch_lines(row(id));
    }
    for (i, (&id, o)) in ids.iter().zip(out.iter_mut()).enumerate() {
        if let Some(&ahead) = ids.get(i + ROWS_AHEAD) {
            prefetch_lines(row(ahead));
        }
        *o = int8_dot(row(id), x);
    }
}

/// `Σ q[p] · x[p]`, summed in 16 lanes (which the compiler keeps in vector registers; a
/// single running sum would be one long chain of dependent additions).
fn int8_dot(q: &[i8], x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let (q_body, q_tail) = q.split_at(q.len() - q.len() % LANES);
    for (qs, xs) in q_body.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for ((acc, &q), &v) in lanes.iter_mut().zip(qs).zip(xs) {
            *acc += f32::from(q) * v;
        }
    }
    let tail: f32 = q_tail
        .iter()
        .zip(&x[q_body.len()..])
        .map(|(&q, &v)| f32::from(q) * v)
        .sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each chosen row's product within 4e-6 of the f64 sum of its terms' magnitudes, in the order of
    /// the ids (repeats and the last row included), at lengths with and without a tail of
    /// the 16 lanes.
    #[test]
    fn chosen_rows_equal_the_plain_sums_within_rounding() {
        for k in [0, 1, 15, 16, 17, 64, 576, 581] {
            let n = 40;
            let rows: Vec<i8> = (0..n * k).map(|i| ((i * 37) % 255) as i8).collect();
            let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.11).cos()).collect();
            let ids: Vec<u32> = vec![39, 0, 7, 7, 22, 1, 38, 5, 9, 10, 11, 12, 13];
            let mut out = vec![f32::NAN; ids.len()];
            chosen_row_dots(&rows, k, &ids, &x, &mut out);
            for (&id, &got) in ids.iter().zip(&out) {
                let row = &rows[id as usize * k..(id as usize + 1) * k];
                let terms = row
                    .iter()
                    .zip(&x)
                    .map(|(&q, &v)| f64::from(q) * f64::from(v));
                let (plain, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                assert!(
                    (f64::from(got) - plain).abs() <= 4e-6 * size,
                    "k {k} row {id}: {got} vs {plain}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "past the 4 rows")]
    fn refuses_a_row_past_the_matrix() {
        chosen_row_dots(&[0; 32], 8, &[4], &[0.0; 8], &mut [0.0]);
    }
}
