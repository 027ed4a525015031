//! CPU time of this process's threads, grouped by thread name: how the server measures
//! the busy time of an engine whose threads it does not own.
//!
//! The many-requests engine runs its kernels (prefill chunks on the CPU and emulated-NPU
//! lanes, batched decode steps) on one pool of named host threads and reports no busy
//! time of its own; the time the operating system gave those threads is what they ran.
//! Linux keeps it per thread in `/proc/self/task/TID/schedstat` (nanoseconds on a CPU),
//! or, without scheduler statistics, in `stat`'s user and system ticks (100 per second:
//! Linux's fixed `USER_HZ`). A thread's name there is cut to 15 bytes.
//!
//! Counted: threads alive at the reading. A group's threads must outlive the counter
//! (a pool's workers do), or its total would drop when one exits.

use std::fs;
use std::path::Path;

/// Linux's `comm` holds at most this many bytes of a thread's name.
const COMM_LEN: usize = 15;

/// Ticks per second of `stat`'s time fields (`USER_HZ`, fixed in Linux's ABI).
const USER_HZ: f64 = 100.0;

/// One group's threads at one reading.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupTime {
    /// Threads whose name starts with the group's prefix.
    pub threads: usize,
    /// Their CPU time together, seconds.
    pub cpu_seconds: f64,
}

/// CPU time of the threads whose names start with each of `prefixes` (cut to 15
/// bytes, as Linux keeps names), one entry per prefix; `None` where `/proc/self/task`
/// cannot be read (not Linux).
pub fn cpu_time_by_prefix(prefixes: &[&str]) -> Option<Vec<GroupTime>> {
    read_tasks(Path::new("/proc/self/task"), prefixes)
}

fn read_tasks(tasks: &Path, prefixes: &[&str]) -> Option<Vec<GroupTime>> {
    let mut groups = vec![GroupTime::default(); prefixes.len()];
    for entry in fs::read_dir(tasks).ok()?.flatten() {
        // A thread that exits between the listing and the reading is skipped.
        let Ok(name) = fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        let name = name.trim_end_matches('\n');
        let Some(group) = prefixes.iter().position(|p| name.starts_with(cut(p))) else {
            continue;
        };
        let Some(seconds) = thread_cpu_seconds(&entry.path()) else {
            continue;
        };
        groups[group].threads += 1;
        groups[group].cpu_seconds += seconds;
    }
    Some(groups)
}

/// `prefix` as Linux would keep it in a thread's name.
fn cut(prefix: &str) -> &str {
    let mut end = prefix.len().min(COMM_LEN);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    &prefix[..end]
}

/// One thread's CPU time, seconds: `schedstat`'s first field, else `stat`'s ticks.
fn thread_cpu_seconds(task: &Path) -> Option<f64> {
    if let Ok(text) = fs::read_to_string(task.join("schedstat"))
        && let Some(ns) = parse_schedstat(&text)
    {
        return Some(ns as f64 / 1e9);
    }
    let text = fs::read_to_string(task.join("stat")).ok()?;
    parse_stat_ticks(&text).map(|ticks| ticks as f64 / USER_HZ)
}

/// `schedstat`: "time on a CPU (ns) time waiting (ns) timeslices".
fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// `stat`'s user plus system ticks (fields 14 and 15; the name, field 2, is in
/// parentheses and may hold spaces and parentheses itself, so fields count from the
/// last `)`).
fn parse_stat_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn stat_ticks_count_from_the_last_parenthesis() {
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 17 5 0 0 20 0 1 0";
        assert_eq!(parse_stat_ticks(stat), Some(22));
        assert_eq!(parse_stat_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_schedstat("123456789 42 7\n"), Some(123_456_789));
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn names_are_matched_as_linux_keeps_them() {
        assert_eq!(cut("hetsched-engine-"), "hetsched-engine");
        assert_eq!(cut("short"), "short");
        // Not cut inside a character.
        assert_eq!(cut("ééééééééé"), "ééééééé");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_spinning_thread_is_counted_and_an_idle_one_barely() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = |name: &str, busy: bool| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if !busy {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                })
                .unwrap()
        };
        let threads = [spin("tt-test-spin", true), spin("tt-test-idle", false)];
        let begun = Instant::now();
        let before = cpu_time_by_prefix(&["tt-test-spin", "tt-test-idle"]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let after = cpu_time_by_prefix(&["tt-test-spin", "tt-test-idle"]).unwrap();
        let wall = begun.elapsed().as_secs_f64();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!((after[0].threads, after[1].threads), (1, 1));
        let spun = after[0].cpu_seconds - before[0].cpu_seconds;
        let idled = after[1].cpu_seconds - before[1].cpu_seconds;
        // A loaded machine gives the spinning thread less than the whole wall time, but
        // well above what a thread asleep takes.
        assert!(
            spun > 0.02 && spun <= wall + 0.02,
            "spun {spun} s of {wall}"
        );
        assert!(idled < spun / 2.0, "idle {idled} s, spinning {spun} s");
    }
}
