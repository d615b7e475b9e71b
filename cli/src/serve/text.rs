//! Stop strings on streamed text. A stop string may arrive split across tokens, so the text
//! that could still become the start of one is held back until the next piece decides; the
//! client never sees a part of text that is later cut, and the stop string itself is not
//! returned (as OpenAI does).

pub struct StopText {
    stops: Vec<String>,
    longest: usize,
    text: String,
    sent: usize,
    matched: Option<usize>,
}

impl StopText {
    pub fn new(stops: Vec<String>) -> StopText {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopText {
            stops,
            longest,
            text: String::new(),
            sent: 0,
            matched: None,
        }
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Appends `piece`; returns the text now safe to show, and whether a stop string ended the
    /// generation (the text up to it is then all of it).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.text.push_str(piece);
        if self.stops.is_empty() {
            return (self.release(self.text.len()), false);
        }
        // A stop string found now ends at or after the first new byte, so it starts at most
        // `longest - 1` bytes before the text not yet shown.
        let mut from = self.sent.saturating_sub(self.longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.text[from..].find(s.as_str()).map(|p| (from + p, i)))
            .min();
        if let Some((at, i)) = hit {
            self.matched = Some(i);
            let out = self.release(at.max(self.sent));
            self.text.truncate(at.max(self.sent));
            return (out, true);
        }
        // Hold back the longest tail that begins some stop string.
        let len = self.text.len();
        let hold = (1..self.longest.min(len - self.sent + 1))
            .rev()
            .find(|&k| {
                self.text.is_char_boundary(len - k)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.starts_with(&self.text[len - k..]))
            })
            .unwrap_or(0);
        (self.release(len - hold), false)
    }

    /// The generation ended without a stop string: everything held back.
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    fn release(&mut self, to: usize) -> String {
        let s = self.text[self.sent..to].to_string();
        self.sent = to;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds pieces; the shown text, and whether a stop hit.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut t = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (s, hit) = t.push(p);
            out.push(s);
            if hit {
                return (out, true);
            }
        }
        out.push(t.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_pieces_is_caught_and_never_shown() {
        let (out, hit) = run(
            &["\n\nUser:"],
            &["Hello", " there\n", "\nUs", "er:", " more"],
        );
        assert!(hit);
        assert_eq!(out.concat(), "Hello there");
        // Nothing of the stop string was shown before it completed.
        assert_eq!(out, vec!["Hello", " there", "", ""]);
    }

    #[test]
    fn held_text_is_released_when_it_turns_out_not_to_stop() {
        let (out, hit) = run(&["END"], &["a E", "N", "x", " b"]);
        assert!(!hit);
        assert_eq!(out, vec!["a ", "", "ENx", " b", ""]);
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_text_ends_before_it() {
        let (out, hit) = run(&["cd", "b"], &["abcd"]);
        assert!(hit);
        assert_eq!(out.concat(), "a");
        let mut t = StopText::new(vec!["cd".into(), "b".into()]);
        t.push("abcd");
        assert_eq!(t.matched(), Some("b"));
        let (out, hit) = run(&["world"], &["hello world", "!"]);
        assert!(hit);
        assert_eq!(out.concat(), "hello ");
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let (out, hit) = run(&["é!"], &["caf", "é", "é", "!"]);
        assert!(hit);
        assert_eq!(out.concat(), "café");
        let (out, hit) = run(&["→x"], &["a→", "→b"]);
        assert!(!hit);
        assert_eq!(out.concat(), "a→→b");
    }

    #[test]
    fn without_stops_everything_streams_at_once() {
        let (out, hit) = run(&[], &["a", "b"]);
        assert!(!hit);
        assert_eq!(out, vec!["a", "b", ""]);
    }
}
