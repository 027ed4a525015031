//! The fuzzer's mutations: bit flips, interesting bytes and integers, truncation, chunk
//! duplication and deletion, splices between pool inputs, extreme numbers in text.

use hetsched_kernels::seeded::SeededRng;

use super::MAX_INPUT;

const BYTES: [u8; 4] = [0, 0xFF, 0x7F, 0x80];
const U32S: [u32; 8] = [
    0,
    1,
    2,
    0x7F,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFE,
    0xFFFF_FFFF,
];
const U64S: [u64; 9] = [
    0,
    1,
    32,
    1 << 31,
    1 << 32,
    1 << 53,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];
const NUMBERS: [&str; 14] = [
    "0",
    "-1",
    "1",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e308",
    "1e309",
    "-0.0",
    "nan",
    "inf",
    "5e-324",
    "99999999999999999999999999",
];

pub(crate) fn below(rng: &mut SeededRng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

pub(crate) fn mutate(rng: &mut SeededRng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    let len = input.len();
    match below(rng, 10) {
        0 if len > 0 => {
            let at = below(rng, len);
            input[at] ^= 1 << below(rng, 8);
        }
        1 if len > 0 => {
            let at = below(rng, len);
            input[at] = BYTES[below(rng, BYTES.len())];
        }
        2 if len > 0 => {
            let at = below(rng, len);
            input[at] = rng.byte();
        }
        3 if len >= 4 => {
            let at = below(rng, len - 3);
            let v = U32S[below(rng, U32S.len())];
            input[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        4 if len >= 8 => {
            let at = below(rng, len - 7);
            let v = U64S[below(rng, U64S.len())];
            input[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        5 => input.truncate(below(rng, len + 1)),
        6 if len > 0 => {
            let from = below(rng, len);
            let n = 1 + below(rng, (len - from).min(256));
            let chunk = input[from..from + n].to_vec();
            let at = below(rng, len + 1);
            input.splice(at..at, chunk);
        }
        7 if len > 0 => {
            let from = below(rng, len);
            let n = 1 + below(rng, (len - from).min(256));
            input.drain(from..from + n);
        }
        8 => {
            let other = &pool[below(rng, pool.len())];
            let cut = below(rng, len + 1);
            let from = below(rng, other.len() + 1);
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
        _ => {
            // A run of digits replaced by an extreme number (text formats).
            let starts: Vec<usize> = (0..len)
                .filter(|&i| {
                    input[i].is_ascii_digit() && (i == 0 || !input[i - 1].is_ascii_digit())
                })
                .collect();
            if starts.is_empty() {
                return;
            }
            let start = starts[below(rng, starts.len())];
            let end = (start..len)
                .find(|&i| !input[i].is_ascii_digit())
                .unwrap_or(len);
            let n = NUMBERS[below(rng, NUMBERS.len())];
            input.splice(start..end, n.bytes());
        }
    }
    input.truncate(MAX_INPUT);
}

// ---------------------------------------------------------------------------
// Driver
