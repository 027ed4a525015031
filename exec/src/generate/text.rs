//! Incremental detokenization: the bytes of each generated token become text as soon as
//! they form whole UTF-8 characters (a character split across byte tokens waits for its
//! last byte), and text that may be the start of a stop string is held back until it is
//! known not to be one, so that a stop string never reaches the output.

/// Turns token bytes into text, stopping at the first stop string.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    /// Bytes of an unfinished UTF-8 character.
    bytes: Vec<u8>,
    /// Decoded text not handed out yet: it may be the start of a stop string.
    held: String,
    stops: Vec<String>,
    stopped: bool,
}

/// What one [`TextStream::push`] produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pushed {
    /// Text that is final: print it.
    pub text: String,
    /// Whether a stop string was reached (the text ends before it).
    pub stopped: bool,
}

impl TextStream {
    /// A stream that stops at the first of `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Self::default()
        }
    }

    /// Adds one token's bytes; returns the text that became final.
    pub fn push(&mut self, token_bytes: &[u8]) -> Pushed {
        if self.stopped {
            return Pushed {
                text: String::new(),
                stopped: true,
            };
        }
        self.bytes.extend_from_slice(token_bytes);
        let decoded = take_utf8(&mut self.bytes);
        self.held.push_str(&decoded);
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = earliest {
            self.stopped = true;
            self.bytes.clear();
            let text = self.held[..at].to_string();
            self.held.clear();
            return Pushed {
                text,
                stopped: true,
            };
        }
        let keep = self.stop_prefix_len();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Pushed {
            text,
            stopped: false,
        }
    }

    /// The rest at the end of generation: held text, and an unfinished character's bytes
    /// as U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.bytes)));
        text
    }

    /// Bytes of the longest suffix of the held text that begins some stop string.
    fn stop_prefix_len(&self) -> usize {
        let held = &self.held;
        (1..=held.len())
            .rev()
            .filter(|&len| held.is_char_boundary(held.len() - len))
            .find(|&len| {
                let suffix = &held[held.len() - len..];
                self.stops.iter().any(|stop| stop.starts_with(suffix))
            })
            .unwrap_or(0)
    }
}

/// The complete UTF-8 characters at the front of `bytes`, removed from it; an invalid
/// sequence becomes U+FFFD, an unfinished one at the end stays.
fn take_utf8(bytes: &mut Vec<u8>) -> String {
    let mut text = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(s) => {
                text.push_str(s);
                start = bytes.len();
                break;
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                text.push_str(
                    std::str::from_utf8(&bytes[start..valid]).expect("checked valid above"),
                );
                match e.error_len() {
                    Some(len) => {
                        text.push('\u{FFFD}');
                        start = valid + len;
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..start);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push_all(stream: &mut TextStream, tokens: &[&[u8]]) -> (Vec<String>, bool) {
        let mut out = Vec::new();
        let mut stopped = false;
        for t in tokens {
            let p = stream.push(t);
            out.push(p.text);
            stopped |= p.stopped;
        }
        (out, stopped)
    }

    #[test]
    fn a_character_split_across_tokens_waits_for_its_last_byte() {
        // "é" is C3 A9; "😀" is F0 9F 98 80.
        let mut s = TextStream::new(&[]);
        let (out, _) = push_all(
            &mut s,
            &[
                b"caf",
                &[0xC3],
                &[0xA9, b'!'],
                &[0xF0, 0x9F],
                &[0x98],
                &[0x80],
            ],
        );
        assert_eq!(out, ["caf", "", "é!", "", "", "😀"]);
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = TextStream::new(&[]);
        assert_eq!(s.push(&[b'a', 0xFF, b'b']).text, "a\u{FFFD}b");
        // An unfinished character at the end is flushed as one replacement.
        assert_eq!(s.push(&[0xE2, 0x82]).text, "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn a_stop_string_is_held_back_and_never_printed() {
        let stops = vec!["\nUser:".to_string()];
        let mut s = TextStream::new(&stops);
        let (out, stopped) = push_all(&mut s, &[b"Hi", b" there\n", b"Us", b"er: more"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Hi there");
        // Held text that turned out not to be a stop is released.
        let mut s = TextStream::new(&stops);
        let (out, stopped) = push_all(&mut s, &[b"a\nU", b"niverse"]);
        assert!(!stopped);
        assert_eq!(out, ["a", "\nUniverse"]);
        assert_eq!(s.finish(), "");
        let mut s = TextStream::new(&stops);
        assert_eq!(s.push(b"x\nUse").text, "x");
        assert_eq!(s.finish(), "\nUse");
    }
}
